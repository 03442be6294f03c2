"""Scheduling: which sequences compute which tokens each step (owns the KV-cache manager)."""

from refengine.scheduler.scheduler import Scheduler
from refengine.scheduler.sequence import FinishReason, Sequence, SequenceStatus, SequenceUpdate

__all__ = ["FinishReason", "Scheduler", "Sequence", "SequenceStatus", "SequenceUpdate"]

"""What the scheduler picked for one sequence this step, before it becomes a `ScheduledSequence`."""

from __future__ import annotations

from dataclasses import dataclass

from refengine.scheduler.sequence import Sequence


@dataclass
class Choice:
    sequence: Sequence
    num_new_tokens: int
    block_table: tuple[int, ...]
    padding: bool = False  # a finished row of a static batch, computed and discarded
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when the sequence got its blocks

"""Beam search's arithmetic, one request at a time (Hugging Face's); the scheduler's side is
`refengine.scheduler.beams`."""

from refengine.beam_search.search import Beam, BeamSearch, BeamStep

__all__ = ["Beam", "BeamSearch", "BeamStep"]

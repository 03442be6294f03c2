"""OpenAI `stop` semantics on a stream of text deltas.

The engine is given the stop sequences too (as the ensemble's `stop_words`), but it matches token
ids, keeps the matched sequence in its output and misses a sequence that the model spells with
other tokens. So the text is matched here as well: the answer ends right before the first
occurrence of any stop sequence, which is never returned. While streaming, text that could be
the beginning of a stop sequence is held back until the next delta decides.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed deltas with `push`; each call returns the text that is safe to release and whether a
    stop sequence was found (then nothing more is to be fed). `flush` releases what is held back
    once the generation has ended without a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop sequences must not be empty")
        self.stops = tuple(stops)
        self._held = ""
        self.released = 0  # characters released so far
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            raise RuntimeError("a stop sequence was already found")
        if not self.stops:
            self.released += len(text)
            return text, False
        buffer = self._held + text
        found = [index for index in (buffer.find(stop) for stop in self.stops) if index >= 0]
        if found:
            out = buffer[: min(found)]
            self._held = ""
            self.stopped = True
        else:
            keep = _longest_partial_match(buffer, self.stops)
            out, self._held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
        self.released += len(out)
        return out, self.stopped

    def flush(self) -> str:
        out, self._held = self._held, ""
        self.released += len(out)
        return out


def _longest_partial_match(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop sequence."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best

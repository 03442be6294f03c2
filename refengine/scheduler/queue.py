"""Sequences kept in `Sequence.sort_key` order: higher priority first, then first come first
served (arrival, then sample index).

Used for both the waiting and the running set, so a preempted sequence goes back to its place
in line, and the last element (the first to be preempted) is the newest of the lowest priority.
With one priority for all this is plain arrival order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from refengine.scheduler.sequence import Sequence


class SequenceQueue:
    def __init__(self) -> None:
        self._items: list[Sequence] = []

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(list(self._items))

    def __getitem__(self, index: int) -> Sequence:
        return self._items[index]

    def insert(self, sequence: Sequence) -> None:
        bisect.insort(self._items, sequence, key=lambda s: s.sort_key)

    def remove(self, sequence: Sequence) -> bool:
        """Remove the sequence if present; returns whether it was."""
        for index, item in enumerate(self._items):
            if item is sequence:
                del self._items[index]
                return True
        return False

    def peek_first(self) -> Sequence | None:
        """The first in line: the oldest of the highest priority."""
        return self._items[0] if self._items else None

    def peek_last(self) -> Sequence | None:
        """The last in line: the newest of the lowest priority."""
        return self._items[-1] if self._items else None

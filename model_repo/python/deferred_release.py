"""`DeferredRelease`: keep objects alive for a while, then drop them from a thread of our choosing.

Why (BLS only): a decoupled BLS call's response iterator is referenced both by Python and by the
stub's own iterator map. Triton 2.51's stub erases its map entry on a background thread that does
not hold the GIL; if Python has already dropped its reference, the iterator and every response
tensor it kept (each owning a numpy array) are destroyed there, without the GIL, which corrupts
the stub's heap (seen as SIGSEGV, "negative dimensions are not allowed" or an abort in the
stub under concurrent cancelled streams). Python backend r24.12 fixed the destructor (#390,
"Hold GIL when deleting numpy array"). Holding our reference for a few seconds after the last
response makes the stub's erase come first, so the final release happens in Python, GIL held.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_DELAY_S = 2.0


class DeferredRelease:
    def __init__(self, delay_s: float = DEFAULT_DELAY_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._delay_s = delay_s
        self._clock = clock
        self._held: collections.deque[tuple[float, Any]] = collections.deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, obj: Any) -> None:
        with self._lock:
            self._held.append((self._clock() + self._delay_s, obj))

    def release_due(self) -> int:
        """Drop the objects whose delay has passed (in the calling thread); how many were dropped."""
        now = self._clock()
        due = []
        with self._lock:
            while self._held and self._held[0][0] <= now:
                due.append(self._held.popleft())
        count = len(due)
        due.clear()  # the last references go here, outside the lock
        return count

"""Class-aware admission in front of the engine: requests wait here, per traffic class, and are released to Triton in
class order up to what the engine runs at once.

This is the mechanism for the targets whose engine cannot reorder its own queue (the engine target's C++ tensorrtllm
model, llmapi 1.2.1; docs/traffic-classes.md), and on the cpu target it bounds each class's queue in front of an engine
that does. `capacity` requests (the engine's max_batch_size: one slot per request, whatever its n) run at once; when
one ends, the next released is:

1. the oldest waiting request of a class running fewer than its `min_share` × capacity slots (a share is a floor, so a
   low class is never starved), the most behind its share first;
2. else the oldest waiting request of the highest-priority class that has one.

A class with `max_queue` holds at most that many waiting requests: one more is answered 429 with Retry-After at once
(OpenAI's error shape), never queued. A waiter whose client goes away is cancelled, and its place is freed: nothing is
sent to the engine for it.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from clients.openai_server.errors import class_queue_full
from clients.openai_server.traffic import TrafficClass, TrafficTable

DEFAULT_ADMISSION_CAPACITY = 8  # a Triton model whose config gives no max_batch_size (0)


@dataclass
class _ClassQueue:
    traffic_class: TrafficClass
    share_slots: int  # min_share × capacity, rounded up (0: no floor)
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    running: int = 0


class Slot:
    """A running request's place; `release()` once it ends (idempotent)."""

    def __init__(self, admission: ClassAdmission, queue: _ClassQueue) -> None:
        self._admission = admission
        self._queue = queue
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._release(self._queue)


class ClassAdmission:
    def __init__(self, table: TrafficTable, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"admission capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._queues = {c.name: _ClassQueue(c, math.ceil(c.min_share * capacity)) for c in table.classes}
        self._order = [self._queues[c.name] for c in table.ranked]
        self._running = 0

    def depth(self, class_name: str) -> int:
        """Requests of the class waiting here."""
        return sum(1 for waiter in self._queues[class_name].waiting if not waiter.done())

    def running(self, class_name: str) -> int:
        return self._queues[class_name].running

    async def acquire(self, traffic_class: TrafficClass) -> Slot:
        """A slot for a request of `traffic_class`: at once if one is free and nobody waits, else in class order;
        OpenAIError 429 if the class's queue is full. Cancelling the wait gives its place up."""
        queue = self._queues[traffic_class.name]
        if self._running < self.capacity and not any(q.waiting for q in self._order):
            return self._start(queue)
        bound = traffic_class.max_queue
        if bound is not None and self.depth(traffic_class.name) >= bound:
            raise class_queue_full(traffic_class.name, bound)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # released to us just as we were cancelled: pass it on
                self._release(queue)
            elif waiter in queue.waiting:  # else already dropped by _next_queue
                queue.waiting.remove(waiter)
            raise
        return Slot(self, queue)

    def _start(self, queue: _ClassQueue) -> Slot:
        self._take(queue)
        return Slot(self, queue)

    def _take(self, queue: _ClassQueue) -> None:
        self._running += 1
        queue.running += 1

    def _release(self, queue: _ClassQueue) -> None:
        self._running -= 1
        queue.running -= 1
        self._release_next()

    def _release_next(self) -> None:
        while self._running < self.capacity:
            queue = self._next_queue()
            if queue is None:
                return
            waiter = queue.waiting.popleft()
            if waiter.done():  # cancelled, not yet removed
                continue
            self._take(queue)
            waiter.set_result(None)

    def _next_queue(self) -> _ClassQueue | None:
        for queue in self._order:
            while queue.waiting and queue.waiting[0].done():
                queue.waiting.popleft()
        behind = [q for q in self._order if q.waiting and q.running < q.share_slots]
        if behind:
            return min(behind, key=lambda q: q.running / q.share_slots)
        return next((q for q in self._order if q.waiting), None)

"""Drive a target: closed loop (`Concurrency`: N callers, each sends its next request when the last
one ends) or open loop (`RequestRate`: arrivals at a rate, Poisson or evenly spaced, whatever
the server's state). Warm-up requests go first and are not recorded; the measured part ends when
`max_requests` were sent or `duration_s` passed (requests in flight then still finish).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.load.records import LoadRequest, RequestRecord
from clients.load.targets import LoadTarget


@dataclass(frozen=True)
class Concurrency:
    callers: int

    def __post_init__(self) -> None:
        if self.callers < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.callers}")

    @property
    def label(self) -> str:
        return f"concurrency {self.callers}"


@dataclass(frozen=True)
class RequestRate:
    per_s: float
    poisson: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.per_s > 0:
            raise ValueError(f"request rate must be > 0 requests/s, got {self.per_s}")

    @property
    def label(self) -> str:
        return f"{'poisson' if self.poisson else 'constant'} {self.per_s:g} req/s"

    def gaps(self) -> Iterator[float]:
        rng = random.Random(self.seed)
        while True:
            yield rng.expovariate(self.per_s) if self.poisson else 1.0 / self.per_s


@dataclass
class LoadRun:
    mode: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0

    @property
    def measured_s(self) -> float:
        return max(self.finished - self.started, 0.0)


async def _send(target: LoadTarget, request: LoadRequest) -> RequestRecord:
    record = RequestRecord(start=time.monotonic(), input_tokens=request.input_tokens)
    try:
        await target.send(request, record)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure is a measured outcome of the run
        record.error = f"{type(error).__name__}: {error}"
        record.end = time.monotonic()
    return record


async def run_load(
    target: LoadTarget,
    requests: Sequence[LoadRequest],
    mode: Concurrency | RequestRate,
    *,
    warmup: int = 0,
    max_requests: int | None = None,
    duration_s: float | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> LoadRun:
    """Send `requests` (cycled when more are needed) to `target`; the measured records in send order."""
    if not requests:
        raise ValueError("the workload has no requests")
    limit = len(requests) if max_requests is None else max_requests
    if limit < 1:
        raise ValueError(f"max_requests must be >= 1, got {limit}")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s}")
    pool = itertools.cycle(requests)
    if warmup > 0:
        callers = mode.callers if isinstance(mode, Concurrency) else 1
        await _closed_loop(target, [next(pool) for _ in range(warmup)], callers, None, lambda record: None)
    run = LoadRun(mode={"concurrency": mode.callers} if isinstance(mode, Concurrency) else {"request_rate": mode.per_s, "poisson": mode.poisson})
    batch = [next(pool) for _ in range(limit)]
    run.started = time.monotonic()
    deadline = None if duration_s is None else run.started + duration_s
    done = on_done or (lambda record: None)
    if isinstance(mode, Concurrency):
        run.records = await _closed_loop(target, batch, mode.callers, deadline, done)
    else:
        run.records = await _open_loop(target, batch, mode, deadline, done)
    run.finished = max((record.end or run.started for record in run.records), default=run.started)
    return run


async def _closed_loop(
    target: LoadTarget, batch: list[LoadRequest], callers: int, deadline: float | None, done: Callable[[RequestRecord], None]
) -> list[RequestRecord]:
    slots: list[RequestRecord | None] = [None] * len(batch)
    next_index = iter(range(len(batch)))

    async def caller() -> None:
        for index in next_index:
            if deadline is not None and time.monotonic() >= deadline:
                return
            slots[index] = record = await _send(target, batch[index])
            done(record)

    await asyncio.gather(*(caller() for _ in range(min(callers, len(batch)))))
    return [record for record in slots if record is not None]


async def _open_loop(
    target: LoadTarget, batch: list[LoadRequest], mode: RequestRate, deadline: float | None, done: Callable[[RequestRecord], None]
) -> list[RequestRecord]:
    tasks: list[asyncio.Task[RequestRecord]] = []
    due = time.monotonic()
    for request, gap in zip(batch, mode.gaps()):
        if deadline is not None and due >= deadline:
            break
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_send(target, request))
        task.add_done_callback(lambda finished: done(finished.result()) if not finished.cancelled() else None)
        tasks.append(task)
        due += gap
    return list(await asyncio.gather(*tasks))

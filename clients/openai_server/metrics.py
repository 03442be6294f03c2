"""The front end's own Prometheus metrics, served on `GET /metrics` in the text exposition format (0.0.4).

Triton 2.51 (the cpu image's bundled server) has no time-to-first-token histogram, and Triton's
counters see a decoupled request only as a whole; the front end sees every token of every choice
as it arrives, so it measures what a client measures (tokenization and the gRPC hop included):

    trtllm_pipeline_openai_time_to_first_token_seconds     histogram: request received -> a choice's first token
    trtllm_pipeline_openai_inter_token_latency_seconds     histogram: between a choice's tokens (a response carrying
                                                           k tokens after a gap g observes g/k, k times)
    trtllm_pipeline_openai_requests_total{endpoint, status} counter: answered requests (status: HTTP status code)

Written by hand (no prometheus_client dependency): a histogram is cumulative buckets, `_sum` and `_count`.
The recording rules (pipeline/deploy/rules.py) take their TTFT / ITL quantiles from these histograms.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Protocol

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "trtllm_pipeline_openai"
TTFT = f"{PREFIX}_time_to_first_token_seconds"
ITL = f"{PREFIX}_inter_token_latency_seconds"
REQUESTS = f"{PREFIX}_requests_total"
# Seconds; the cpu target's tokens take milliseconds to tens of ms, a GPU's first token up to seconds under load.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _number(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


class Histogram:
    def __init__(self, name: str, description: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be increasing and distinct, got {buckets}")
        self.name, self.description, self.buckets = name, description, tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += count
            self._sum += value * count

    @property
    def count(self) -> int:
        return sum(self._counts)

    def exposition(self) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        lines = [f"# HELP {self.name} {self.description}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip((*self.buckets, math.inf), counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        lines += [f"{self.name}_sum {_number(total)}", f"{self.name}_count {cumulative}"]
        return lines


class FrontEndMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram(TTFT, "Time from receiving a request to the first token of each of its choices.", TTFT_BUCKETS)
        self.itl = Histogram(ITL, "Time between consecutive tokens of a choice.", ITL_BUCKETS)
        self._requests: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._requests[(endpoint, status)] = self._requests.get((endpoint, status), 0) + 1

    def exposition(self) -> str:
        lines = [*self.ttft.exposition(), *self.itl.exposition()]
        lines += [f"# HELP {REQUESTS} Requests answered, by endpoint and HTTP status.", f"# TYPE {REQUESTS} counter"]
        with self._lock:
            requests = sorted(self._requests.items())
        lines += [f'{REQUESTS}{{endpoint="{endpoint}",status="{status}"}} {count}' for (endpoint, status), count in requests]
        return "\n".join(lines) + "\n"


class _Event(Protocol):
    index: int
    completion_tokens: int  # cumulative per choice


async def timed(events: AsyncGenerator[_Event, None], metrics: FrontEndMetrics, started: float) -> AsyncIterator[_Event]:
    """`events` unchanged, observing each choice's first-token time (from `started`, a time.monotonic()) and token gaps.
    Closing this closes `events` at once (its cleanup cancels the Triton requests of a client that went away)."""
    last: dict[int, tuple[float, int]] = {}  # choice -> (time of its last token, tokens so far)
    async with contextlib.aclosing(events):
        async for event in events:
            now = time.monotonic()
            seen = last.get(event.index)
            new_tokens = event.completion_tokens - (seen[1] if seen else 0)
            if new_tokens > 0:
                if seen is None:  # tokens of a first response beyond its first one have no gap to observe
                    metrics.ttft.observe(now - started)
                else:
                    metrics.itl.observe((now - seen[0]) / new_tokens, new_tokens)
                last[event.index] = (now, event.completion_tokens)
            yield event

"""The front end's own Prometheus metrics, served on `GET /metrics` in the text exposition format (0.0.4).

Triton 2.51 (the cpu image's bundled server) has no time-to-first-token histogram, and Triton's
counters see a decoupled request only as a whole; the front end sees every token of every choice
as it arrives, so it measures what a client measures (tokenization and the gRPC hop included):

    trtllm_pipeline_openai_time_to_first_token_seconds     histogram: request received -> a choice's first token
    trtllm_pipeline_openai_inter_token_latency_seconds     histogram: between a choice's tokens (a response carrying
                                                           k tokens after a gap g observes g/k, k times)
    trtllm_pipeline_openai_requests_total{endpoint, status} counter: answered `/v1/*` requests (status: HTTP status
                                                           code; endpoint: the route, `other` for an unknown URL)
                                                           With API keys a `key` label too: the key's name, never the
                                                           key; `-` for a request refused for its key (401)
    trtllm_pipeline_openai_slo_choices_total{class, slo}    counter, with traffic classes (serve.traffic): finished
                                                           choices of each class whose first token came within the
                                                           class's TTFT objective and whose mean inter-token time kept
                                                           its TPOT objective (slo="met"), or not ("missed")

With traffic classes the two histograms carry a `class` label too (the rules sum it away).

Kept in a registry of their own (prometheus_client), one per application, without the `_created` series.
The recording rules (pipeline/deploy/rules.py) take their TTFT / ITL quantiles from these histograms.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "trtllm_pipeline_openai"
TTFT = f"{PREFIX}_time_to_first_token_seconds"
ITL = f"{PREFIX}_inter_token_latency_seconds"
REQUESTS = f"{PREFIX}_requests_total"
SLO_CHOICES = f"{PREFIX}_slo_choices_total"
# Seconds; the cpu target's tokens take milliseconds to tens of ms, a GPU's first token up to seconds under load.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

# The `_created` gauges say when the process started, which `up` already tells.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated


class SloObjectives(Protocol):
    """A traffic class as the metrics see it (traffic.TrafficClass)."""

    @property
    def name(self) -> str: ...
    @property
    def ttft_slo_ms(self) -> float | None: ...
    @property
    def tpot_slo_ms(self) -> float | None: ...


class FrontEndMetrics:
    def __init__(self, *, keyed: bool = False, classed: bool = False) -> None:
        self.keyed = keyed
        self.classed = classed
        self.registry = CollectorRegistry(auto_describe=True)
        by_class = ("class",) if classed else ()
        self._ttft = Histogram(
            TTFT, "Time from receiving a request to the first token of each of its choices.", by_class, buckets=TTFT_BUCKETS, registry=self.registry
        )
        self._itl = Histogram(ITL, "Time between consecutive tokens of a choice.", by_class, buckets=ITL_BUCKETS, registry=self.registry)
        self._slo = (
            Counter(
                SLO_CHOICES.removesuffix("_total"),
                "Finished choices by traffic class, and whether they met its objectives.",
                ("class", "slo"),
                registry=self.registry,
            )
            if classed
            else None
        )
        labels = ("endpoint", "status", "key") if keyed else ("endpoint", "status")
        help_text = "Requests answered, by endpoint, HTTP status" + (" and API key name." if keyed else ".")
        self._requests = Counter(REQUESTS.removesuffix("_total"), help_text, labels, registry=self.registry)

    def count_request(self, endpoint: str, status: int, key: str) -> None:
        """`key`: the API key's name; dropped when the server has no keys."""
        labels = {"endpoint": endpoint, "status": str(status)}
        self._requests.labels(**labels, **({"key": key} if self.keyed else {})).inc()

    def observe_first_token(self, seconds: float, traffic_class: SloObjectives | None = None) -> None:
        self._histogram(self._ttft, traffic_class).observe(seconds)

    def observe_gap(self, seconds: float, tokens: int, traffic_class: SloObjectives | None = None) -> None:
        """`tokens` tokens arrived `seconds` after the choice's previous one: each observes its share."""
        histogram = self._histogram(self._itl, traffic_class)
        for _ in range(tokens):
            histogram.observe(seconds / tokens)

    def observe_choice(self, traffic_class: SloObjectives, ttft_s: float, tpot_s: float | None) -> None:
        """A finished choice of `traffic_class`: its first-token time and mean inter-token time (None: one token)."""
        if self._slo is None:
            return
        met = (traffic_class.ttft_slo_ms is None or ttft_s * 1000 <= traffic_class.ttft_slo_ms) and (
            traffic_class.tpot_slo_ms is None or tpot_s is None or tpot_s * 1000 <= traffic_class.tpot_slo_ms
        )
        self._slo.labels(traffic_class.name, "met" if met else "missed").inc()

    def _histogram(self, histogram: Histogram, traffic_class: SloObjectives | None) -> Histogram:
        if not self.classed:
            return histogram
        if traffic_class is None:
            raise ValueError("a server with traffic classes observes every token under its class")
        return histogram.labels(traffic_class.name)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


class _Event(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...  # cumulative per choice


_E = TypeVar("_E", bound=_Event)


async def timed(
    events: AsyncGenerator[_E, None], metrics: FrontEndMetrics, started: float, traffic_class: SloObjectives | None = None
) -> AsyncGenerator[_E, None]:
    """`events` unchanged, observing each choice's first-token time (from `started`, a time.monotonic()) and token gaps,
    under `traffic_class` where the server has classes; and, once the events end, whether each choice met its class's
    objectives. Closing this closes `events` at once (its cleanup cancels the Triton requests of a client that went
    away); a choice cut short so is not counted against the objectives."""
    first: dict[int, float] = {}  # choice -> its first token's time
    last: dict[int, tuple[float, int]] = {}  # choice -> (time of its last token, tokens so far)
    async with contextlib.aclosing(events):
        async for event in events:
            now = time.monotonic()
            seen = last.get(event.index)
            new_tokens = event.completion_tokens - (seen[1] if seen else 0)
            if new_tokens > 0:
                if seen is None:  # tokens of a first response beyond its first one have no gap to observe
                    first[event.index] = now
                    metrics.observe_first_token(now - started, traffic_class)
                else:
                    metrics.observe_gap(now - seen[0], new_tokens, traffic_class)
                last[event.index] = (now, event.completion_tokens)
            yield event
    if traffic_class is None:
        return
    for index, (end, tokens) in last.items():
        tpot = (end - first[index]) / (tokens - 1) if tokens > 1 else None
        metrics.observe_choice(traffic_class, first[index] - started, tpot)

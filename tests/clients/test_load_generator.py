"""The load generator against fake targets with known timings: concurrency is held, arrivals
follow the rate, warm-up is not measured, failures are counted, and the figures are right."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.load import (
    Concurrency,
    LoadRequest,
    RequestRate,
    RequestRecord,
    SloLimits,
    make_target,
    percentile,
    run_load,
    summarize,
)


class FakeTarget:
    """Streams `max_tokens` tokens, `gap_s` apart after `ttft_s`; fails prompts starting with 'fail'."""

    endpoint = "fake"
    url = "fake://"

    def __init__(self, ttft_s: float = 0.01, gap_s: float = 0.002) -> None:
        self.ttft_s, self.gap_s = ttft_s, gap_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[tuple[float, str]] = []

    async def send(self, request: LoadRequest, record: RequestRecord) -> None:
        self.sent.append((time.monotonic(), request.prompt))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.prompt.startswith("fail"):
                raise RuntimeError("the server said no")
            await asyncio.sleep(self.ttft_s)
            record.add_tokens(1, time.monotonic())
            for _ in range(request.max_tokens - 1):
                await asyncio.sleep(self.gap_s)
                record.add_tokens(1, time.monotonic())
            record.end = time.monotonic()
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        pass


def workload(n: int, tokens: int = 4) -> list[LoadRequest]:
    return [LoadRequest(f"prompt {i}", tokens, input_tokens=10 + i) for i in range(n)]


def test_closed_loop_holds_the_concurrency_and_measures_every_request():
    target = FakeTarget()
    run = asyncio.run(run_load(target, workload(12), Concurrency(3), warmup=2))
    assert target.max_in_flight == 3
    assert len(target.sent) == 14  # 2 warm-up + 12 measured
    assert len(run.records) == 12 and all(record.ok for record in run.records)
    summary = summarize(run)
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["output_tokens"] == 48
    assert summary["ttft_ms"]["p50"] >= 10.0
    assert summary["ttft_ms"]["p50"] < summary["e2e_ms"]["p50"]
    assert summary["itl_ms"]["min"] >= 2.0
    assert summary["requests_per_s"] == pytest.approx(12 / run.measured_s, rel=1e-3)


def test_requests_are_cycled_when_more_are_asked_for_than_the_workload_has():
    target = FakeTarget(ttft_s=0, gap_s=0)
    run = asyncio.run(run_load(target, workload(3), Concurrency(2), max_requests=7))
    assert len(run.records) == 7
    assert [prompt for _, prompt in target.sent].count("prompt 0") == 3


def test_open_loop_sends_at_the_requested_rate_whatever_the_server_does():
    """Request i is due i/rate after the first and never sent earlier (sleeps do not end early); how much later is
    the machine's load, so the achieved rate is not asserted (`bench load` reports it). Sends do not wait for answers:
    a server far slower than the whole schedule still has requests overlapping."""
    assert list(zip(range(5), RequestRate(50, poisson=False).gaps())) == [(index, 0.02) for index in range(5)]
    target = FakeTarget(ttft_s=0.5, gap_s=0.0)  # slower than the 0.1 s the six arrivals span
    before = time.monotonic()
    run = asyncio.run(run_load(target, workload(6, tokens=1), RequestRate(50, poisson=False)))
    starts = [at for at, _ in target.sent]
    assert all(at - before >= 0.02 * index - 1e-6 for index, at in enumerate(starts)), np.diff(starts)
    assert starts == sorted(starts) and target.max_in_flight >= 2
    assert len(run.records) == 6


def test_poisson_arrivals_are_seeded():
    first = list(zip(range(20), RequestRate(10, seed=3).gaps()))
    again = list(zip(range(20), RequestRate(10, seed=3).gaps()))
    other = list(zip(range(20), RequestRate(10, seed=4).gaps()))
    assert first == again and first != other
    assert np.mean([gap for _, gap in first]) == pytest.approx(0.1, rel=0.6)


def test_a_duration_bound_stops_sending_new_requests():
    """One caller, each request at least 0.05 s: a 0.3 s bound lets at most 6 of the 1000 start, however loaded the
    machine (a slower one starts fewer); the first starts as the run does."""
    target = FakeTarget(ttft_s=0.05, gap_s=0.0)
    run = asyncio.run(run_load(target, workload(1000, tokens=1), Concurrency(1), duration_s=0.3))
    assert 1 <= len(run.records) <= 6 and len(target.sent) == len(run.records)


def test_failures_are_recorded_not_raised_and_miss_the_goodput():
    requests = [LoadRequest("fail please", 3), *workload(3)]
    run = asyncio.run(run_load(FakeTarget(), requests, Concurrency(2)))
    summary = summarize(run, SloLimits(ttft_ms=10_000))
    assert summary["failed"] == 1 and summary["completed"] == 3
    assert summary["errors"] == {"RuntimeError: the server said no": 1}
    assert summary["good_requests"] == 3


def test_goodput_counts_only_requests_within_every_limit():
    def record(ttft: float, gap: float, tokens: int = 3) -> RequestRecord:
        r = RequestRecord(start=0.0)
        for i in range(tokens):
            r.add_tokens(1, ttft + i * gap)
        r.end = ttft + (tokens - 1) * gap
        return r

    limits = SloLimits(ttft_ms=100, itl_ms=10)
    assert limits.met_by(record(0.05, 0.005))
    assert not limits.met_by(record(0.2, 0.005))  # TTFT over
    assert not limits.met_by(record(0.05, 0.02))  # ITL over
    assert SloLimits(e2e_ms=50).met_by(record(0.01, 0.01))
    assert not SloLimits().met_by(RequestRecord(start=0.0, error="boom", end=1.0))


def test_inter_token_latency_follows_genai_perf_and_openai_usage_counts():
    r = RequestRecord(start=1.0)
    r.add_tokens(1, 1.5)
    r.add_tokens(3, 1.8)  # one response carrying three tokens
    r.end = 1.8
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_s == pytest.approx(0.3 / 3)
    r.output_tokens = 7  # as the final usage says
    assert r.itl_s == pytest.approx(0.3 / 6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50), st.sampled_from([0, 1, 50, 90, 99, 100]))
def test_percentile_agrees_with_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        Concurrency(0)
    with pytest.raises(ValueError, match="request rate must be > 0"):
        RequestRate(0)
    with pytest.raises(ValueError, match="endpoint must be one of grpc, http, openai"):
        make_target("kafka", "x")
    with pytest.raises(ValueError, match="served model name"):
        make_target("openai", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="no requests"):
        asyncio.run(run_load(FakeTarget(), [], Concurrency(1)))
    with pytest.raises(ValueError, match="duration must be > 0"):
        asyncio.run(run_load(FakeTarget(), workload(1), Concurrency(1), duration_s=0))


def test_openai_target_asks_for_exact_lengths_and_usage():
    target = make_target("openai", "http://127.0.0.1:9/", model="tiny")
    body = target.body(LoadRequest("hi", 5))
    assert target.url == "http://127.0.0.1:9/v1"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["min_tokens"] == 5 and body["temperature"] == 0.0
    assert "min_tokens" not in target.body(LoadRequest("hi", 5, exact_output=False))
    asyncio.run(target.close())

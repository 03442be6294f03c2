"""`bench soak`: chaos traffic against the served model for a while, then proof that nothing broke.

Before and after the traffic (clients.load.chaos: gRPC, HTTP SSE and OpenAI streams, a share
of them cut), the soak reads the server's vitals: readiness, the engine's KV blocks in use and
active requests (from the metrics port), the RSS of tritonserver and of every Python-backend stub
in its process group (and the stubs' pids: a restarted stub is a crash), the `Signal (N)` lines of
its log, and the greedy answer to a fixed prompt. The soak fails (`SoakVerdict.problems`) on a
dead or unready server, a signal, a changed stub, KV blocks or requests that do not drain back
to idle, a failed request that was not cut, a process of the server that went away, or a changed greedy answer.
While the traffic runs, every process is sampled at a fixed interval (soak/samples.py: RSS, descriptors, threads);
the verdict carries the samples and each process's RSS slope after the warm-up, judged only against a bound the
caller gives (`max_rss_slope_mb_per_min`).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.samples import Sampler, Trend, sample_processes, samples_dict, trends, vanished
from clients import TritonLLMClient
from clients.load.chaos import ChaosOutcome, ChaosPlan, ChaosTargets, run_chaos
from pipeline.serve import process
from pipeline.serve.cleanup import received_signals, signal_line

GREEDY_PROMPT = "def __init__(self"
GREEDY_TOKENS = 24
_SERIES = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")


@dataclass(frozen=True)
class Vitals:
    ready: bool
    kv_blocks_used: float | None
    active_requests: float | None
    server_rss_mb: float
    stub_rss_mb: float
    stub_pids: tuple[int, ...]
    signals: tuple[str, ...]

    @property
    def idle(self) -> bool:
        return self.kv_blocks_used == 0 and self.active_requests == 0


def read_vitals(server_pid: int, http_url: str, metrics_url: str, log_path: Path) -> Vitals:
    engine = _engine_gauges(metrics_url)
    server_rss, stubs = _group_memory(server_pid)
    return Vitals(
        ready=_ready(http_url),
        kv_blocks_used=engine.get(("nv_trt_llm_kv_cache_block_metrics", "used")),
        active_requests=engine.get(("nv_trt_llm_request_metrics", "active")),
        server_rss_mb=server_rss,
        stub_rss_mb=sum(rss for _, rss in stubs),
        stub_pids=tuple(sorted(pid for pid, _ in stubs)),
        signals=log_signals(log_path),
    )


def wait_until_idle(read: Callable[[], Vitals], timeout_s: float = 30.0) -> Vitals:
    """The vitals once the engine has drained (or as they are when `timeout_s` ran out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        vitals = read()
        if vitals.idle or time.monotonic() >= deadline or not vitals.ready:
            return vitals
        time.sleep(0.2)


def log_signals(log_path: Path) -> tuple[str, ...]:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ()
    return tuple(signal_line(signum) for signum in received_signals(text))


def greedy_answer(grpc_url: str, prompt: str = GREEDY_PROMPT, max_tokens: int = GREEDY_TOKENS) -> str:
    with TritonLLMClient(grpc_url, "grpc", timeout=60, retries=0) as client:
        return client.generate(prompt, max_tokens=max_tokens, temperature=0.0).text


@dataclass
class SoakVerdict:
    plan: dict[str, Any]
    traffic: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any]
    greedy_before: str
    greedy_after: str | None
    problems: list[str] = field(default_factory=list)
    trends: list[dict[str, Any]] = field(default_factory=list)  # per process, soak/samples.py Trend
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def judge(outcome: ChaosOutcome, before: Vitals, after: Vitals, greedy_before: str, greedy_after: str | None) -> list[str]:
    problems = []
    if not after.ready:
        problems.append("the server is not ready after the traffic")
    new_signals = after.signals[len(before.signals) :]
    if new_signals:
        counts = {line: new_signals.count(line) for line in dict.fromkeys(new_signals)}
        problems.append("the server log shows " + ", ".join(line if n == 1 else f"{line} ×{n}" for line, n in counts.items()))
    if after.stub_pids != before.stub_pids:
        problems.append(f"the Python-backend stubs changed (before {list(before.stub_pids)}, after {list(after.stub_pids)}): a stub died")
    if not after.idle:
        problems.append(f"not idle after the traffic: {after.kv_blocks_used} KV blocks used, {after.active_requests} active requests")
    if outcome.stopped:
        problems.append(f"the traffic was stopped after {outcome.seconds:.0f} s: {outcome.stopped}")
    if outcome.failed:
        problems.append(f"{outcome.failed} request(s) failed that were not cut: {outcome.errors[:3]}")
    if greedy_after != greedy_before:
        problems.append(f"the greedy answer changed: {greedy_before!r} before, {greedy_after!r} after")
    return problems


def trend_problems(found: list[Trend], max_slope_mb_per_min: float | None) -> list[str]:
    """The processes whose RSS kept rising faster than `max_slope_mb_per_min` after the warm-up."""
    if max_slope_mb_per_min is None:
        return []
    return [
        f"{t.name} RSS rose {t.rss_slope_mb_per_min:+.2f} MB/min after the warm-up ({t.rss_first_mb:.0f} -> {t.rss_last_mb:.0f} MB; "
        f"bound {max_slope_mb_per_min:g} MB/min)"
        for t in found
        if t.rss_slope_mb_per_min is not None and t.rss_slope_mb_per_min > max_slope_mb_per_min
    ]


def soak(
    plan: ChaosPlan,
    targets: ChaosTargets,
    *,
    server_pid: int,
    metrics_url: str,
    log_path: Path,
    progress: Callable[[str], None] = lambda line: None,
    sample_interval_s: float = 30.0,
    max_rss_slope_mb_per_min: float | None = None,
) -> SoakVerdict:
    """Run `plan` against a served model (its tritonserver is `server_pid`), sampling its processes every
    `sample_interval_s` seconds, and judge the result."""
    read = lambda: read_vitals(server_pid, targets.http_url, metrics_url, log_path)  # noqa: E731
    greedy_before = greedy_answer(targets.grpc_url)
    before = wait_until_idle(read)
    progress(f"before: {_describe(before)}; chaos: {_describe_plan(plan)}; sampling every {sample_interval_s:g} s")
    known_signals = len(before.signals)

    def server_died() -> str | None:  # a crashed server may hang in its signal handler: stop at once
        if process.read_process(server_pid) is None:
            return f"the server (pid {server_pid}) is gone"
        signals = log_signals(log_path)
        return f"the server log showed {signals[-1]}" if len(signals) > known_signals else None

    sampler = Sampler(lambda: sample_processes(server_pid), sample_interval_s).start()
    try:
        outcome, greedy_after, after = _traffic_then_drain(plan, targets, read, server_died, progress)
    finally:
        samples = sampler.stop()  # the last sample after the drain: what the run left behind
    found = trends(samples)
    problems = judge(outcome, before, after, greedy_before, greedy_after) + vanished(samples) + trend_problems(found, max_rss_slope_mb_per_min)
    return SoakVerdict(
        plan=asdict(plan),
        traffic=outcome.as_dict(),
        before=_vitals_dict(before),
        after=_vitals_dict(after),
        greedy_before=greedy_before,
        greedy_after=greedy_after,
        problems=problems,
        trends=[asdict(t) for t in found],
        samples=samples_dict(samples),
    )


def _traffic_then_drain(
    plan: ChaosPlan, targets: ChaosTargets, read: Callable[[], Vitals], server_died: Callable[[], str | None], progress: Callable[[str], None]
) -> tuple[ChaosOutcome, str | None, Vitals]:
    outcome = asyncio.run(run_chaos(plan, targets, stop_reason=server_died))
    progress(
        f"traffic: {outcome.sent} sent, {outcome.done} done, {outcome.cut} cut, {outcome.failed} failed in {outcome.seconds:.0f} s"
        + (f"; stopped early: {outcome.stopped}" if outcome.stopped else "")
    )
    drained = wait_until_idle(read)
    try:
        greedy_after = greedy_answer(targets.grpc_url) if drained.ready else None
    except Exception as error:  # a dead server: judged below
        progress(f"greedy request after the traffic failed: {error}")
        greedy_after = None
    after = wait_until_idle(read)  # the gauges are published every 100 ms: let them show the greedy request's end
    progress(f"after: {_describe(after)}")
    return outcome, greedy_after, after


def _vitals_dict(vitals: Vitals) -> dict[str, Any]:
    return {**asdict(vitals), "idle": vitals.idle, "total_rss_mb": round(vitals.server_rss_mb + vitals.stub_rss_mb, 1)}


def _describe(vitals: Vitals) -> str:
    return (
        f"ready {vitals.ready}, KV blocks used {vitals.kv_blocks_used}, active {vitals.active_requests}, "
        f"RSS {vitals.server_rss_mb:.0f} MB server + {vitals.stub_rss_mb:.0f} MB in {len(vitals.stub_pids)} stubs"
    )


def _describe_plan(plan: ChaosPlan) -> str:
    amount = f"{plan.requests} requests" if plan.duration_s is None else f"{plan.duration_s:.0f} s"
    return f"{amount} at concurrency {plan.concurrency}, {plan.cut_fraction:.0%} cut, over {', '.join(plan.endpoints)}"


def _ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _engine_gauges(metrics_url: str) -> dict[tuple[str, str], float]:
    """(family, kind) → value of the engine's gauges, summed over models (kind: the `*_type` label)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match is None or not match.group(1).startswith("nv_trt_llm_"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        kind = next((value for key, value in labels.items() if key.endswith("_type")), "")
        key = (match.group(1), kind)
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def _group_memory(server_pid: int) -> tuple[float, list[tuple[int, float]]]:
    """RSS (MB) of the server, and (pid, RSS MB) of each live process of its group but the server."""
    members = process.group_members(server_pid)  # started in its own session: its pid is its group
    server_rss = next((m.rss_bytes / 1e6 for m in members if m.pid == server_pid), 0.0)
    return server_rss, [(m.pid, m.rss_bytes / 1e6) for m in members if m.pid != server_pid]

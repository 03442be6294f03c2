"""Per-model server time from Triton's statistics extension (`GET /v2/models/stats`).

Triton counts, per model, the requests that succeeded and the nanoseconds they spent queued
(`queue`), having their inputs copied in (`compute_input`), in the model's `execute`
(`compute_infer`) and having their outputs copied out (`compute_output`), and how many times
`execute` ran (`execution_count`: fewer than requests when a dynamic batcher batched them). A
snapshot before and after a measured round gives each model's share of it. For a decoupled
Python model (`tensorrt_llm`, the BLS) `compute_infer` ends when `execute` returns, not when
the last response is sent: the time of the threads that answer later is not in it (the
process-group CPU figure has it). The ensemble's own entry sums its steps' times.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")

Snapshot = dict[str, dict[str, int]]  # model → {"requests", "executions", phase → ns}


def snapshot(http_url: str, timeout: float = 10.0) -> Snapshot:
    """Every model's cumulative counters now."""
    with urllib.request.urlopen(f"{http_url}/v2/models/stats", timeout=timeout) as response:
        document = json.loads(response.read())
    return {entry["name"]: _counters(entry) for entry in document.get("model_stats", [])}


def settled_snapshot(http_url: str, *, interval_s: float = 0.02, attempts: int = 10) -> Snapshot:
    """A snapshot once two in a row agree: Triton records a request's statistics after its
    response went out, so the last calls of a round can still be counting when the client has
    its answer."""
    current = snapshot(http_url)
    for _ in range(attempts):
        time.sleep(interval_s)
        again = snapshot(http_url)
        if again == current:
            break
        current = again
    return current


def _counters(entry: dict[str, Any]) -> dict[str, int]:
    stats = entry.get("inference_stats", {})
    counters = {"requests": int(stats.get("success", {}).get("count", 0)), "executions": int(entry.get("execution_count", 0))}
    for phase in PHASES:
        counters[phase] = int(stats.get(phase, {}).get("ns", 0))
    return counters


def add_difference(total: Snapshot, before: Snapshot, after: Snapshot) -> None:
    """Add `after − before` of every model into `total`."""
    for model, counters in after.items():
        earlier = before.get(model, {})
        into = total.setdefault(model, dict.fromkeys(counters, 0))
        for key, value in counters.items():
            into[key] = into.get(key, 0) + value - earlier.get(key, 0)


def per_request(total: Snapshot, client_requests: int) -> dict[str, dict[str, float]]:
    """Each model that ran: its phases in µs per client request, and its requests and `execute`
    calls per client request (a streamed request runs postprocessing once per response)."""
    rows = {}
    for model in sorted(total, key=lambda name: MODELS.index(name) if name in MODELS else len(MODELS)):
        counters = total[model]
        if not counters.get("requests"):
            continue
        row = {phase + "_us": round(counters[phase] / 1000.0 / client_requests, 1) for phase in PHASES}
        row["requests_per_request"] = round(counters["requests"] / client_requests, 2)
        row["executions_per_request"] = round(counters["executions"] / client_requests, 2)
        rows[model] = row
    return rows

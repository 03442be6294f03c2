"""The performance gate's arithmetic: thresholds against one load point, and regression against
an earlier stored result. Pure functions of JSON-ready dicts."""

from __future__ import annotations

from typing import Any

from pipeline.config.spec import PerformanceGateSpec
from pipeline.load.report import value_at

# metric → True when a higher value is worse
REGRESSION_METRICS: dict[str, bool] = {"ttft_ms.p99": True, "itl_ms.p99": True, "output_tokens_per_s": False}
# what must match for two results to be compared
COMPARABLE_KEYS = ("endpoint", "concurrency", "num_requests", "input_tokens", "output_tokens", "seed")


def threshold_failures(point: dict[str, Any], gate: PerformanceGateSpec) -> list[str]:
    """One message per missed threshold, naming the metric, its value and the limit."""
    failures = []
    if point["failed"]:
        failures.append(f"{point['failed']} of {point['requests']} requests failed: {'; '.join(point['errors'])[:300]}")
    for name, limits in (("max_ttft_ms", gate.max_ttft_ms), ("max_itl_ms", gate.max_itl_ms), ("max_e2e_ms", gate.max_e2e_ms)):
        if limits is None:
            continue
        metric = name.removeprefix("max_")
        for quantile in ("p50", "p90", "p99"):
            limit = getattr(limits, quantile)
            value = value_at(point, f"{metric}.{quantile}")
            if limit is None:
                continue
            if value is None:
                failures.append(f"{metric} {quantile} was not measured (gate.performance.{name}.{quantile} {limit} ms)")
            elif value > limit:
                failures.append(f"{metric} {quantile} {value:.2f} ms exceeds gate.performance.{name}.{quantile} {limit} ms")
    for name, metric, unit in (("min_output_tokens_per_s", "output_tokens_per_s", "tokens/s"), ("min_requests_per_s", "requests_per_s", "requests/s")):
        limit = getattr(gate, name)
        if limit is not None and point[metric] < limit:
            failures.append(f"{metric} {point[metric]:.2f} {unit} is below gate.performance.{name} {limit}")
    if gate.goodput is not None and point["requests"]:
        share = 100.0 * point["good_requests"] / point["requests"]
        if share < gate.goodput.min_pct:
            failures.append(f"goodput {share:.1f}% of requests met the SLO {point['slo']}, below gate.performance.goodput.min_pct {gate.goodput.min_pct}%")
    return failures


def regression(point: dict[str, Any], workload: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """Percent change of each regression metric against `previous` (a stored report), positive =
    worse; None when there is nothing comparable."""
    if previous is None or previous.get("point") is None:
        return None
    if any(previous.get("workload", {}).get(key) != workload.get(key) for key in COMPARABLE_KEYS):
        return {"comparable": False, "against": previous.get("digest"), "why": "a different workload"}
    changes = {}
    for metric, higher_is_worse in REGRESSION_METRICS.items():
        new, old = value_at(point, metric), value_at(previous["point"], metric)
        if new is None or not old:
            continue
        change = 100.0 * (new - old) / old
        changes[metric] = round(change if higher_is_worse else -change, 2)
    return {"comparable": True, "against": previous.get("digest"), "created": previous.get("created"), "worse_pct": changes}


def regression_failures(change: dict[str, Any] | None, gate: PerformanceGateSpec) -> list[str]:
    if gate.max_regression_pct is None or not change or not change.get("comparable"):
        return []
    return [
        f"{metric} is {pct:.1f}% worse than the stored result {change['against']} (gate.performance.max_regression_pct {gate.max_regression_pct}%)"
        for metric, pct in change["worse_pct"].items()
        if pct > gate.max_regression_pct
    ]

"""Per-run figures from request records: percentiles, throughput, goodput under SLO limits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clients.load.driver import LoadRun

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class SloLimits:
    """Per-request limits for goodput (milliseconds); None leaves a metric unconstrained. A request
    counts as good when it succeeded and meets every limit set."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, record: Any) -> bool:
        if not record.ok:
            return False
        checks = ((self.ttft_ms, record.ttft_s), (self.itl_ms, record.itl_s), (self.e2e_ms, record.e2e_s))
        return all(limit is None or (value is not None and value * 1000.0 <= limit) for limit, value in checks)

    def as_dict(self) -> dict[str, float]:
        return {key: value for key, value in asdict(self).items() if value is not None}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution_ms(values_s: Sequence[float]) -> dict[str, float] | None:
    if not values_s:
        return None
    values = [value * 1000.0 for value in values_s]
    figures = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    figures.update(mean=sum(values) / len(values), min=min(values), max=max(values))
    return {key: round(value, 3) for key, value in figures.items()}


def summarize(run: LoadRun, slo: SloLimits | None = None) -> dict[str, Any]:
    """The JSON-ready figures of one load run."""
    slo = slo or SloLimits()
    records = run.records
    ok = [record for record in records if record.ok]
    duration = run.measured_s
    output_tokens = sum(record.output_tokens for record in ok)
    good = [record for record in ok if slo.met_by(record)]
    errors: dict[str, int] = {}
    for record in records:
        if not record.ok:
            key = (record.error or "no tokens")[:200]
            errors[key] = errors.get(key, 0) + 1
    input_counts = [record.input_tokens for record in ok if record.input_tokens is not None]
    return {
        "mode": run.mode,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": errors,
        "duration_s": round(duration, 4),
        "requests_per_s": _rate(len(ok), duration),
        "output_tokens": output_tokens,
        "output_tokens_per_s": _rate(output_tokens, duration),
        "mean_input_tokens": round(sum(input_counts) / len(input_counts), 2) if input_counts else None,
        "mean_output_tokens": round(output_tokens / len(ok), 2) if ok else None,
        "ttft_ms": distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": distribution_ms([r.itl_s for r in ok if r.itl_s is not None]),
        "e2e_ms": distribution_ms([r.e2e_s for r in ok if r.e2e_s is not None]),
        "slo": slo.as_dict(),
        "good_requests": len(good),
        "goodput_requests_per_s": _rate(len(good), duration),
    }


def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 4) if seconds > 0 else 0.0

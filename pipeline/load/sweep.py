"""The load sweep: a concurrency (or request-rate) sweep against the served model.

`run_load_sweep` drives one or more endpoints — Triton gRPC / HTTP streaming, and the
OpenAI-compatible front end in front of the same Triton — point after point, endpoints
interleaved at each point so they see the same machine state; each point's requests are the
same workload. `pipeline.load.serving` starts what the sweep runs against.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.load import Concurrency, LoadRequest, RequestRate, SloLimits, make_target, run_load, summarize

Progress = Callable[[str, int, int], None]  # (label, done, total)


@dataclass(frozen=True)
class Endpoints:
    """Where each endpoint of one served model answers."""

    grpc: str | None = None  # host:port
    http: str | None = None  # http://host:port
    openai: str | None = None  # http://host:port/v1
    model_name: str = ""  # the name the OpenAI front end serves
    triton_contract: str = "ensemble"  # the tensors grpc|http speak: "ensemble", or "llmapi" (NVIDIA's llmapi model)
    api_key: str | None = field(default=None, repr=False)  # what the openai endpoint is sent as `Authorization: Bearer`
    server_version: str | None = None
    server: Any = field(default=None, compare=False, repr=False)  # the TritonServer, when `serving.serving` started it

    def url(self, endpoint: str) -> str:
        url = getattr(self, endpoint)
        if url is None:
            raise ValueError(f"endpoint {endpoint!r} is not served here")
        return url


@dataclass(frozen=True)
class SweepOptions:
    endpoints: tuple[str, ...] = ("grpc",)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8)
    request_rates: tuple[float, ...] = ()
    requests_per_point: int = 32
    warmup: int = 4
    duration_s: float | None = None
    slo: SloLimits = field(default_factory=SloLimits)
    poisson: bool = True
    seed: int = 0

    def modes(self) -> list[Concurrency | RequestRate]:
        if self.request_rates:
            return [RequestRate(rate, poisson=self.poisson, seed=self.seed) for rate in self.request_rates]
        return [Concurrency(callers) for callers in self.concurrencies]


def run_load_sweep(
    endpoints: Endpoints,
    workload: Sequence[LoadRequest],
    options: SweepOptions,
    *,
    progress: Progress | None = None,
    recipe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every (mode, endpoint) point of the sweep; a JSON-ready dict with `points` and `overhead`."""
    started_at = _dt.datetime.now(_dt.timezone.utc)
    load_before = os.getloadavg()[0]
    points = []
    for mode in options.modes():
        for endpoint in options.endpoints:
            label = f"{endpoint} · {mode.label}"
            summary = asyncio.run(_measure(endpoints, endpoint, workload, mode, options, label, progress))
            points.append({"endpoint": endpoint, "label": label, **summary})
    return {
        "benchmark": "load",
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_before": round(load_before, 2),
            "load_avg_after": round(os.getloadavg()[0], 2),
        },
        "server_version": endpoints.server_version,
        "recipe": {
            **(recipe or {}),
            "endpoints": list(options.endpoints),
            "requests_per_point": options.requests_per_point,
            "warmup": options.warmup,
            "duration_s": options.duration_s,
            "slo": options.slo.as_dict(),
        },
        "points": points,
        "overhead": openai_overhead(points),
    }


async def _measure(
    endpoints: Endpoints, endpoint: str, workload: Sequence[LoadRequest], mode: Any, options: SweepOptions, label: str, progress: Progress | None
) -> dict[str, Any]:
    openai = endpoint == "openai"
    target = make_target(
        endpoint,
        endpoints.url(endpoint),
        model=endpoints.model_name if openai else None,
        contract=endpoints.triton_contract,
        api_key=endpoints.api_key if openai else None,
    )
    total = options.requests_per_point
    done = 0

    def on_done(_record: Any) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(label, done, total)

    try:
        run = await run_load(target, workload, mode, warmup=options.warmup, max_requests=total, duration_s=options.duration_s, on_done=on_done)
    finally:
        await target.close()
    return summarize(run, options.slo)


def openai_overhead(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each mode measured over both gRPC and the OpenAI front end: what the front end adds."""
    by_mode: dict[str, dict[str, dict[str, Any]]] = {}
    for point in points:
        by_mode.setdefault(_mode_key(point["mode"]), {})[point["endpoint"]] = point
    rows = []
    for key, pair in by_mode.items():
        grpc, openai = pair.get("grpc"), pair.get("openai")
        if not grpc or not openai or not grpc["completed"] or not openai["completed"]:
            continue
        rows.append(
            {
                "mode": key,
                "ttft_p50_ms_added": round(openai["ttft_ms"]["p50"] - grpc["ttft_ms"]["p50"], 3),
                "e2e_p50_ms_added": round(openai["e2e_ms"]["p50"] - grpc["e2e_ms"]["p50"], 3),
                "itl_p50_ms_added": _difference(openai.get("itl_ms"), grpc.get("itl_ms")),
                "throughput_ratio": round(openai["output_tokens_per_s"] / grpc["output_tokens_per_s"], 4) if grpc["output_tokens_per_s"] else None,
            }
        )
    return rows


def _difference(a: dict | None, b: dict | None) -> float | None:
    return None if not a or not b else round(a["p50"] - b["p50"], 3)


def _mode_key(mode: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(mode.items()))

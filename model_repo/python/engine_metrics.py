"""Triton custom metrics of the cpu `tensorrt_llm` model, named like TensorRT-LLM's backend.

    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max|free|used|tokens_per"}
    nv_trt_llm_request_metrics{request_type="active|waiting|scheduled|max"}

served on Triton's /metrics endpoint next to its own families, so dashboards written for the
engine target read the cpu target too. Inside Triton's stub only.
"""

from __future__ import annotations

from typing import Any, Callable

import triton_python_backend_utils as pb_utils

KV_BLOCK_TYPES = ("max", "free", "used", "tokens_per")
REQUEST_TYPES = ("active", "waiting", "scheduled", "max")


class EngineMetrics:
    def __init__(self, engine: Any, labels: dict[str, str], active_requests: Callable[[], int]) -> None:
        self._engine = engine
        self._active_requests = active_requests
        self._kv_family = pb_utils.MetricFamily(
            name="nv_trt_llm_kv_cache_block_metrics",
            description="KV-cache blocks of the reference engine",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._request_family = pb_utils.MetricFamily(
            name="nv_trt_llm_request_metrics",
            description="Requests in the reference engine",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self._kv = {kind: self._kv_family.Metric(labels={**labels, "kv_cache_block_type": kind}) for kind in KV_BLOCK_TYPES}
        self._requests = {
            kind: self._request_family.Metric(labels={**labels, "request_type": kind}) for kind in REQUEST_TYPES
        }
        self._last: dict[str, float] = {}

    def update(self) -> None:
        usage = self._engine.kv_cache_usage()
        scheduler = self._engine.scheduler
        kv_values = {
            "max": usage.num_blocks,
            "free": usage.num_free_blocks,
            "used": usage.num_used_blocks,
            "tokens_per": usage.tokens_per_block,
        }
        request_values = {
            "active": self._active_requests(),
            "waiting": scheduler.num_waiting,
            "scheduled": scheduler.num_running,
            "max": self._engine.config.max_batch_size,
        }
        for kind, value in kv_values.items():
            self._set(f"kv/{kind}", self._kv[kind], value)
        for kind, value in request_values.items():
            self._set(f"request/{kind}", self._requests[kind], value)

    def close(self) -> None:
        # The Metric objects must go before their MetricFamily (the stub enforces the order).
        self._kv.clear()
        self._requests.clear()
        self._kv_family = None
        self._request_family = None

    def _set(self, key: str, metric: Any, value: float) -> None:
        if self._last.get(key) != value:
            metric.set(float(value))
            self._last[key] = value

"""Triton custom metrics of the cpu `tensorrt_llm` model, served on Triton's /metrics endpoint
next to its own families.

Gauges named like TensorRT-LLM's Triton backend (inflight_batcher_llm's custom metrics), so
dashboards written for the engine target read the cpu target too:

    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max|free|used|tokens_per|reused|fraction"}
    nv_trt_llm_request_metrics{request_type="active|waiting|scheduled|max"}
    nv_trt_llm_general_metrics{general_type="iteration_counter"}

(`reused` counts KV blocks taken from the prefix cache since start, as the backend's; `fraction`
is used / max.) Counters the backend has no equivalent for, the project's own (monotonic, so
Prometheus `rate()` applies):

    trtllm_pipeline_tokens_total{token_type="generated|prompt_computed|prompt_reused"}
    trtllm_pipeline_prefix_cache_hits_total      requests admitted with a reused prefix
    trtllm_pipeline_preemptions_total            sequences preempted by recompute
    trtllm_pipeline_draft_tokens_total{draft_token_type="drafted|accepted"}
                                                 speculative decoding: draft tokens verified / accepted

and, on a Medusa engine only (labels bounded: depth 1 .. the number of heads, which no tree is deeper than):

    trtllm_pipeline_medusa_tree_steps_total      sequence-steps that verified a tree of candidates
    trtllm_pipeline_medusa_accepted_tokens_total{depth="1".."K"}
                                                 tree nodes accepted, by depth (depth d: a step's d-th draft token)

(accepted tokens per tree step: rate(trtllm_pipeline_draft_tokens_total{draft_token_type="accepted"}) /
rate(trtllm_pipeline_medusa_tree_steps_total)).

Every value comes from the engine (`LLMEngine.kv_cache_usage()`, `.stats()`, the scheduler's
queues). `FAMILIES`, `families` and `engine_values` are plain data and functions; only `EngineMetrics` needs
Triton's stub (`triton_python_backend_utils`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

GAUGE = "gauge"
COUNTER = "counter"


class Family(NamedTuple):
    name: str
    kind: str
    description: str
    label: str | None  # the label that tells the family's series apart (None: one series)
    label_values: tuple[str, ...] = ()


KV_BLOCK_TYPES = ("max", "free", "used", "tokens_per", "reused", "fraction")
REQUEST_TYPES = ("active", "waiting", "scheduled", "max")
TOKEN_TYPES = ("generated", "prompt_computed", "prompt_reused")
DRAFT_TOKEN_TYPES = ("drafted", "accepted")

FAMILIES: tuple[Family, ...] = (
    Family("nv_trt_llm_kv_cache_block_metrics", GAUGE, "KV-cache blocks of the reference engine", "kv_cache_block_type", KV_BLOCK_TYPES),
    Family("nv_trt_llm_request_metrics", GAUGE, "Requests in the reference engine", "request_type", REQUEST_TYPES),
    Family("nv_trt_llm_general_metrics", GAUGE, "Engine iterations of the reference engine", "general_type", ("iteration_counter",)),
    Family(
        "trtllm_pipeline_tokens_total",
        COUNTER,
        "Tokens of the reference engine: generated, and prompt tokens computed or reused from the prefix cache",
        "token_type",
        TOKEN_TYPES,
    ),
    Family("trtllm_pipeline_prefix_cache_hits_total", COUNTER, "Requests admitted with a prefix reused from the KV cache", None),
    Family("trtllm_pipeline_preemptions_total", COUNTER, "Sequences preempted (recomputed later) by the reference engine", None),
    Family(
        "trtllm_pipeline_draft_tokens_total",
        COUNTER,
        "Speculative decoding: draft tokens the target verified, and those it accepted",
        "draft_token_type",
        DRAFT_TOKEN_TYPES,
    ),
)


MEDUSA_TREE_STEPS = "trtllm_pipeline_medusa_tree_steps_total"
MEDUSA_ACCEPTED_BY_DEPTH = "trtllm_pipeline_medusa_accepted_tokens_total"


def families(num_medusa_heads: int) -> tuple[Family, ...]:
    """The families of an engine with `num_medusa_heads` Medusa heads (0: not a Medusa engine, `FAMILIES` only)."""
    if not num_medusa_heads:
        return FAMILIES
    depths = tuple(str(depth) for depth in range(1, num_medusa_heads + 1))
    return FAMILIES + (
        Family(MEDUSA_TREE_STEPS, COUNTER, "Medusa: sequence-steps that verified a tree of candidates", None),
        Family(MEDUSA_ACCEPTED_BY_DEPTH, COUNTER, "Medusa: tree nodes accepted, by depth in the tree", "depth", depths),
    )


def series_key(family: str, label_value: str | None = None) -> tuple[str, str | None]:
    return (family, label_value)


def engine_values(engine: Any, active_requests: int) -> dict[tuple[str, str | None], float]:
    """The current value of every series, read from the engine (keys: `series_key`)."""
    usage = engine.kv_cache_usage()
    stats = engine.stats()
    scheduler = engine.scheduler
    kv = {
        "max": usage.num_blocks,
        "free": usage.num_free_blocks,
        "used": usage.num_used_blocks,
        "tokens_per": usage.tokens_per_block,
        "reused": stats.num_prompt_tokens_reused // usage.tokens_per_block,  # prefixes are whole blocks
        "fraction": usage.num_used_blocks / usage.num_blocks if usage.num_blocks else 0.0,
    }
    requests = {
        "active": active_requests,
        "waiting": scheduler.num_waiting,
        "scheduled": scheduler.num_running,
        "max": engine.config.max_batch_size,
    }
    tokens = {
        "generated": stats.num_generated_tokens,
        "prompt_computed": stats.num_prompt_tokens_computed,
        "prompt_reused": stats.num_prompt_tokens_reused,
    }
    values: dict[tuple[str, str | None], float] = {}
    values.update({series_key("nv_trt_llm_kv_cache_block_metrics", k): v for k, v in kv.items()})
    values.update({series_key("nv_trt_llm_request_metrics", k): v for k, v in requests.items()})
    values[series_key("nv_trt_llm_general_metrics", "iteration_counter")] = stats.num_steps
    values.update({series_key("trtllm_pipeline_tokens_total", k): v for k, v in tokens.items()})
    values[series_key("trtllm_pipeline_prefix_cache_hits_total")] = stats.num_prefix_cache_hits
    values[series_key("trtllm_pipeline_preemptions_total")] = stats.num_preemptions
    values[series_key("trtllm_pipeline_draft_tokens_total", "drafted")] = stats.num_draft_tokens
    values[series_key("trtllm_pipeline_draft_tokens_total", "accepted")] = stats.num_accepted_draft_tokens
    if engine.num_medusa_heads:
        values.update(_medusa_values(stats, engine.num_medusa_heads))
    return {key: float(value) for key, value in values.items()}


def _medusa_values(stats: Any, num_heads: int) -> dict[tuple[str, str | None], float]:
    by_depth = dict.fromkeys(range(1, num_heads + 1), 0)
    for path, count in stats.tree_node_acceptances:
        by_depth[len(path)] += count
    values: dict[tuple[str, str | None], float] = {series_key(MEDUSA_ACCEPTED_BY_DEPTH, str(depth)): count for depth, count in by_depth.items()}
    values[series_key(MEDUSA_TREE_STEPS)] = stats.num_tree_steps
    return values


class EngineMetrics:
    """The engine's families (`families`: `FAMILIES`, and Medusa's on a Medusa engine) in Triton, refreshed by
    `update()` (the model's watcher thread)."""

    def __init__(self, engine: Any, labels: dict[str, str], active_requests: Callable[[], int]) -> None:
        import triton_python_backend_utils as pb_utils

        self._engine = engine
        self._active_requests = active_requests
        kinds = {GAUGE: pb_utils.MetricFamily.GAUGE, COUNTER: pb_utils.MetricFamily.COUNTER}
        self._families: list[Any] = []
        self._metrics: dict[tuple[str, str | None], tuple[str, Any]] = {}
        for family in families(engine.num_medusa_heads):
            triton_family = pb_utils.MetricFamily(name=family.name, description=family.description, kind=kinds[family.kind])
            self._families.append(triton_family)
            for value in family.label_values or (None,):
                series_labels = dict(labels) if value is None else {**labels, cast(str, family.label): value}  # label values come with a label
                self._metrics[series_key(family.name, value)] = (family.kind, triton_family.Metric(labels=series_labels))
        self._last: dict[tuple[str, str | None], float] = {}

    def update(self) -> None:
        for key, value in engine_values(self._engine, self._active_requests()).items():
            kind, metric = self._metrics[key]
            last = self._last.get(key)
            if last == value:
                continue
            if kind == GAUGE:
                metric.set(value)
            elif value > (last or 0.0):  # a counter only goes up: publish the increase
                metric.increment(value - (last or 0.0))
            self._last[key] = value

    def close(self) -> None:
        # The Metric objects must go before their MetricFamily (the stub enforces the order).
        self._metrics.clear()
        self._families.clear()

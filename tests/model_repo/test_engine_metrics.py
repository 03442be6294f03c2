"""The cpu LLM model's custom metrics (model_repo/python/engine_metrics.py) and the Grafana dashboard
that shows them next to Triton's own: every panel's PromQL names a series that the cpu model or
Triton publishes, counters publish increases only, gauges the current value."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from clients.openai_server import metrics as front_end_metrics
from pipeline.config.spec import Spec
from pipeline.deploy import monitoring
from refengine import EngineStats, KVCacheUsage

REPO = Path(__file__).resolve().parents[2]


def _load_model_code(name: str) -> types.ModuleType:
    """A module of model_repo/python (not a package; loaded without touching sys.path)."""
    spec = importlib.util.spec_from_file_location(f"model_code_{name}", REPO / "model_repo" / "python" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine_metrics = _load_model_code("engine_metrics")

# Triton 2.51's own families on a CPU-only server (as its /metrics lists them; no GPU families).
TRITON_FAMILIES = {
    "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes", "nv_cpu_utilization",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_pending_request_count", "nv_inference_queue_duration_us", "nv_inference_request_duration_us",
    "nv_inference_request_failure", "nv_inference_request_success", "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
}  # fmt: skip
TRITON_LABELS = {"model", "version"}

_IDENTIFIER = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"')


def promql_selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: value}) of every series selector in a PromQL expression."""
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping clauses
    selectors = []
    for name, braces, call in _IDENTIFIER.findall(expr):
        if call and not braces:
            continue  # a function or aggregation
        selectors.append((name, {key: value for key, _, value in _MATCHER.findall(braces)}))
    return selectors


def test_promql_selectors():
    expr = 'sum by (model) (rate(a_b[1m])) / clamp_min(sum(x{k="v"}) + 1e-9, 1)'
    assert promql_selectors(expr) == [("a_b", {}), ("x", {"k": "v"})]


def dashboard_selectors() -> list[tuple[str, str, dict[str, str]]]:
    spec = Spec.model_validate(yaml.safe_load((REPO / "build_configs" / "tiny-cpu.yaml").read_text()))
    panels = monitoring.dashboard(spec, "cpu")["panels"]
    return [(panel["title"], name, labels) for panel in panels for target in panel["targets"] for name, labels in promql_selectors(target["expr"])]


FRONT_END_BUCKETS = {f"{front_end_metrics.TTFT}_bucket", f"{front_end_metrics.ITL}_bucket"}


def test_every_dashboard_query_names_a_published_series():
    families = {family.name: family for family in engine_metrics.FAMILIES}
    selectors = dashboard_selectors()
    assert selectors
    for title, name, labels in selectors:
        if name in TRITON_FAMILIES:
            assert set(labels) <= TRITON_LABELS, (title, name, labels)
            continue
        if name in FRONT_END_BUCKETS:  # the OpenAI front end's histograms (clients/openai_server/metrics.py)
            assert not labels, (title, name, labels)
            continue
        assert name in families, f"panel {title!r} reads {name}, which neither Triton nor the cpu model publishes"
        family = families[name]
        for key, value in labels.items():
            assert key == family.label and value in family.label_values, (title, name, key, value)


def test_the_dashboard_shows_engine_metrics_next_to_tritons():
    read = {}
    for title, name, labels in dashboard_selectors():
        read.setdefault(title, set()).add((name, tuple(sorted(labels.values()))))
    titles = list(read)
    for triton_panel in ("Throughput", "Request latency", "Queue time", "KV-cache usage", "LLM requests"):
        assert triton_panel in titles
    assert ("trtllm_pipeline_tokens_total", ("generated",)) in read["Tokens / s"]
    assert {("trtllm_pipeline_tokens_total", ("prompt_reused",)), ("trtllm_pipeline_tokens_total", ("prompt_computed",))} <= read[
        "Prefix-cache hit rate (prompt tokens)"
    ]
    assert {("trtllm_pipeline_prefix_cache_hits_total", ()), ("trtllm_pipeline_preemptions_total", ())} <= read["Prefix hits and preemptions"]
    assert ("nv_trt_llm_general_metrics", ("iteration_counter",)) in read["Engine iterations / s"]
    assert (f"{front_end_metrics.TTFT}_bucket", ()) in read["Time to first token (OpenAI front end)"]
    assert (f"{front_end_metrics.ITL}_bucket", ()) in read["Inter-token latency (OpenAI front end)"]


def test_families_are_named_like_the_backend_or_as_counters():
    for family in engine_metrics.FAMILIES:
        if family.kind == engine_metrics.COUNTER:
            assert family.name.startswith("trtllm_pipeline_") and family.name.endswith("_total")
        else:
            assert family.name.startswith("nv_trt_llm_") and family.name.endswith("_metrics")
    families = {family.name: family for family in engine_metrics.FAMILIES}
    # the label values TensorRT-LLM's backend uses for the same figures
    assert {"max", "free", "used", "tokens_per", "reused"} <= set(families["nv_trt_llm_kv_cache_block_metrics"].label_values)
    assert families["nv_trt_llm_general_metrics"].label_values == ("iteration_counter",)


# -- EngineMetrics against a fake Triton stub -------------------------------------------------------
class FakeMetric:
    def __init__(self, family: FakeFamily, labels: dict[str, str]) -> None:
        self.family, self.labels, self.calls = family, labels, []

    def set(self, value: float) -> None:
        if self.family.kind != "gauge":
            raise RuntimeError("set() on a counter")
        self.calls.append(("set", value))

    def increment(self, value: float) -> None:
        if value < 0:
            raise RuntimeError("a counter cannot go down")
        self.calls.append(("increment", value))

    @property
    def value(self) -> float:
        total = 0.0
        for verb, value in self.calls:
            total = value if verb == "set" else total + value
        return total


class FakeFamily:
    GAUGE, COUNTER = "gauge", "counter"
    created: list[FakeFamily] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind, self.metrics = name, description, kind, []
        FakeFamily.created.append(self)

    def Metric(self, labels: dict[str, str]) -> FakeMetric:  # noqa: N802  (the stub's spelling)
        metric = FakeMetric(self, labels)
        self.metrics.append(metric)
        return metric


@dataclass
class FakeScheduler:
    num_waiting: int = 0
    num_running: int = 0


@dataclass
class FakeEngine:
    usage: KVCacheUsage = field(default_factory=lambda: KVCacheUsage(64, 0, 64, 0, 0, 32))
    counts: EngineStats = field(default_factory=EngineStats)
    scheduler: FakeScheduler = field(default_factory=FakeScheduler)
    config: types.SimpleNamespace = field(default_factory=lambda: types.SimpleNamespace(max_batch_size=8))
    num_medusa_heads: int = 0

    def kv_cache_usage(self) -> KVCacheUsage:
        return self.usage

    def stats(self) -> EngineStats:
        return self.counts


@pytest.fixture
def stub(monkeypatch):
    FakeFamily.created = []
    module = types.ModuleType("triton_python_backend_utils")
    module.MetricFamily = FakeFamily
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    return module


def series(name: str, label_value: str | None = None) -> FakeMetric:
    [family] = [f for f in FakeFamily.created if f.name == name]
    [metric] = [m for m in family.metrics if label_value is None or label_value in m.labels.values()]
    return metric


def test_engine_metrics_create_every_series_with_the_model_labels(stub):
    engine_metrics.EngineMetrics(FakeEngine(), {"model": "tensorrt_llm", "version": "1"}, active_requests=lambda: 0)
    assert [f.name for f in FakeFamily.created] == [f.name for f in engine_metrics.FAMILIES]
    for family, spec in zip(FakeFamily.created, engine_metrics.FAMILIES):
        assert family.kind == spec.kind
        assert len(family.metrics) == max(1, len(spec.label_values))
        for metric in family.metrics:
            assert metric.labels["model"] == "tensorrt_llm" and metric.labels["version"] == "1"


def test_counters_publish_increases_and_gauges_the_current_value(stub):
    engine = FakeEngine()
    active = [0]
    metrics = engine_metrics.EngineMetrics(engine, {"model": "m", "version": "1"}, active_requests=lambda: active[0])
    metrics.update()
    assert series("nv_trt_llm_kv_cache_block_metrics", "max").value == 64
    assert series("trtllm_pipeline_tokens_total", "generated").calls == []  # zero: nothing to add
    engine.usage = KVCacheUsage(64, 4, 60, 0, 100, 32)
    engine.counts = EngineStats(
        num_steps=9, num_generated_tokens=8, num_prompt_tokens_computed=70, num_prompt_tokens_reused=64,
        num_prefix_cache_hits=1, num_preemptions=2,
    )  # fmt: skip
    engine.scheduler = FakeScheduler(num_waiting=1, num_running=2)
    active[0] = 3
    metrics.update()
    assert series("nv_trt_llm_kv_cache_block_metrics", "used").value == 4
    assert series("nv_trt_llm_kv_cache_block_metrics", "fraction").value == 4 / 64
    assert series("nv_trt_llm_kv_cache_block_metrics", "reused").value == 2  # 64 tokens = 2 blocks of 32
    assert series("nv_trt_llm_request_metrics", "active").value == 3
    assert series("nv_trt_llm_request_metrics", "waiting").value == 1
    assert series("nv_trt_llm_request_metrics", "scheduled").value == 2
    assert series("nv_trt_llm_general_metrics", "iteration_counter").value == 9
    assert series("trtllm_pipeline_tokens_total", "generated").calls == [("increment", 8)]
    assert series("trtllm_pipeline_tokens_total", "prompt_computed").value == 70
    assert series("trtllm_pipeline_tokens_total", "prompt_reused").value == 64
    assert series("trtllm_pipeline_prefix_cache_hits_total").value == 1
    assert series("trtllm_pipeline_preemptions_total").value == 2
    engine.counts = EngineStats(num_steps=12, num_generated_tokens=11, num_prompt_tokens_computed=70,
                                num_prompt_tokens_reused=64, num_prefix_cache_hits=1, num_preemptions=2)  # fmt: skip
    engine.usage = KVCacheUsage(64, 0, 64, 2, 0, 32)
    metrics.update()
    assert series("trtllm_pipeline_tokens_total", "generated").calls == [("increment", 8), ("increment", 3)]
    assert series("trtllm_pipeline_preemptions_total").calls == [("increment", 2)]  # unchanged: no call
    assert series("nv_trt_llm_kv_cache_block_metrics", "used").value == 0
    metrics.close()


def test_values_come_from_the_engine():
    engine = FakeEngine(counts=EngineStats(num_generated_tokens=5, num_prompt_tokens_reused=96))
    values = engine_metrics.engine_values(engine, active_requests=2)
    assert values[("trtllm_pipeline_tokens_total", "generated")] == 5
    assert values[("nv_trt_llm_kv_cache_block_metrics", "reused")] == 3
    assert values[("nv_trt_llm_request_metrics", "max")] == 8
    expected = {(f.name, v) for f in engine_metrics.FAMILIES for v in (f.label_values or (None,))}
    assert set(values) == expected


def test_speculative_draft_tokens_are_counters():
    engine = FakeEngine(counts=EngineStats(num_draft_tokens=12, num_accepted_draft_tokens=5))
    values = engine_metrics.engine_values(engine, active_requests=0)
    assert values[("trtllm_pipeline_draft_tokens_total", "drafted")] == 12
    assert values[("trtllm_pipeline_draft_tokens_total", "accepted")] == 5


MEDUSA_STATS = EngineStats(
    num_draft_tokens=40, num_accepted_draft_tokens=9, num_tree_steps=6, tree_node_acceptances=(((0,), 5), ((1,), 1), ((0, 0), 2), ((0, 0, 0), 1))
)


def test_a_medusa_engine_publishes_tree_steps_and_acceptances_by_depth():
    values = engine_metrics.engine_values(FakeEngine(counts=MEDUSA_STATS, num_medusa_heads=4), active_requests=0)
    assert values[(engine_metrics.MEDUSA_TREE_STEPS, None)] == 6
    by_depth = {depth: values[(engine_metrics.MEDUSA_ACCEPTED_BY_DEPTH, depth)] for depth in ("1", "2", "3", "4")}
    assert by_depth == {"1": 6, "2": 2, "3": 1, "4": 0}  # every depth up to the heads' count, 0 included
    assert sum(by_depth.values()) == values[("trtllm_pipeline_draft_tokens_total", "accepted")]
    expected = {(f.name, v) for f in engine_metrics.families(4) for v in (f.label_values or (None,))}
    assert set(values) == expected


def test_medusa_families_exist_on_medusa_engines_only(stub):
    plain = engine_metrics.engine_values(FakeEngine(counts=MEDUSA_STATS), active_requests=0)
    assert not any(name.startswith("trtllm_pipeline_medusa_") for name, _ in plain)
    metrics = engine_metrics.EngineMetrics(FakeEngine(counts=MEDUSA_STATS, num_medusa_heads=3), {"model": "m", "version": "1"}, active_requests=lambda: 0)
    metrics.update()
    assert [f.name for f in FakeFamily.created] == [f.name for f in engine_metrics.families(3)]
    assert [m.labels["depth"] for m in series_family(engine_metrics.MEDUSA_ACCEPTED_BY_DEPTH).metrics] == ["1", "2", "3"]
    assert series(engine_metrics.MEDUSA_TREE_STEPS).value == 6
    assert series(engine_metrics.MEDUSA_ACCEPTED_BY_DEPTH, "2").value == 2
    for family in engine_metrics.families(3):
        assert family.kind == engine_metrics.COUNTER or family in engine_metrics.FAMILIES
    metrics.close()


def series_family(name: str) -> FakeFamily:
    [family] = [f for f in FakeFamily.created if f.name == name]
    return family

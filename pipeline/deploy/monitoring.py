"""Prometheus and Grafana: Prometheus' scrape config, Grafana's provisioning and dashboard (a deploy kind runs
the services: pipeline.deploy.compose.monitoring_services).

Prometheus scrapes the Triton service's metrics port on the deployment's network (`triton:8002`), and
the project's OpenAI front end (`openai:9000/metrics`: time to first token, inter-token latency) where the
deployment runs it (not on the llmapi target, whose OpenAI endpoint is trtllm-serve).
Grafana gets a provisioned Prometheus datasource and one dashboard: Triton's own families
(`nv_inference_*`, `nv_cpu_*`, `nv_pinned_memory_pool_*` on a CPU-only server:
triton-inference-server/server docs/user_guide/metrics.md), then the LLM model's (model_repo/python/engine_metrics.py; the gauges
carry TensorRT-LLM's backend names, so those panels read the engine target too):

    nv_inference_request_success / _failure      counters, per model
    nv_inference_request_duration_us             cumulative µs, per model
    nv_inference_queue_duration_us               cumulative µs, per model
    nv_inference_pending_request_count           gauge, per model
    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max|free|used|tokens_per|reused|fraction"}
    nv_trt_llm_request_metrics{request_type="active|waiting|scheduled|max"}
    nv_trt_llm_general_metrics{general_type="iteration_counter"}
    trtllm_pipeline_tokens_total{token_type="generated|prompt_computed|prompt_reused"}   cpu target only
    trtllm_pipeline_prefix_cache_hits_total, trtllm_pipeline_preemptions_total          cpu target only
    trtllm_pipeline_openai_time_to_first_token_seconds, _inter_token_latency_seconds     the OpenAI front end's histograms
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import layout, rules

DATASOURCE_UID = "prometheus"
DASHBOARD_UID = "trtllm-pipeline"
SCRAPE_INTERVAL = "5s"
RETENTION = "15d"
RATE_WINDOW = "1m"


# -- files ---------------------------------------------------------------------------------------
def prometheus_config(spec: Spec, target: str) -> dict[str, Any]:
    jobs = [(rules.TRITON_JOB, f"{layout.TRITON_SERVICE}:{layout.CONTAINER_METRICS_PORT}")]
    if rules.runs_openai_front_end(spec):
        jobs.append((rules.OPENAI_JOB, f"{layout.OPENAI_SERVICE}:{layout.OPENAI_PORT}"))
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "15s"},
        "rule_files": [Path(rules.RULES_FILE).name],  # relative to prometheus.yml: beside it on the host and in the container
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [address], "labels": {rules.BUILD_LABEL: spec.name, "target": target}}],
            }
            for job, address in jobs
        ],
    }


def grafana_datasources() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": f"http://{layout.PROMETHEUS_SERVICE}:{layout.PROMETHEUS_PORT}",
                "isDefault": True,
                "editable": False,
            }
        ],
    }


def grafana_dashboard_providers() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "trtllm-pipeline",
                "folder": "trtllm-pipeline",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "options": {"path": layout.GRAFANA_DASHBOARDS_MOUNT},
            }
        ],
    }


def _rate(family: str) -> str:
    return f"sum by (model) (rate({family}[{RATE_WINDOW}]))"


def _per_request_ms(family: str) -> str:
    return f"{_rate(family)} / {_rate('nv_inference_request_success')} / 1000"


def _kv(kind: str) -> str:
    return f'sum(nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}"}})'


def _total_rate(family: str, selector: str = "") -> str:
    return f"sum(rate({family}{selector}[{RATE_WINDOW}]))"


def _tokens(kind: str) -> str:
    return _total_rate("trtllm_pipeline_tokens_total", f'{{token_type="{kind}"}}')


def _front_end_quantile(histogram: str, quantile: float) -> str:
    return f"1000 * histogram_quantile({quantile:g}, sum by (le) (rate({histogram}_bucket[{RATE_WINDOW}])))"


def _front_end_latency(histogram: str) -> tuple[tuple[str, str], ...]:
    return tuple((_front_end_quantile(histogram, q), name) for name, q in rules.QUANTILES)


# (title, unit, [(expression, legend)]) — the dashboard's panels, in reading order.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Throughput", "reqps", ((_rate("nv_inference_request_success"), "{{model}}"),)),
    ("Request latency", "ms", ((_per_request_ms("nv_inference_request_duration_us"), "{{model}}"),)),
    ("Queue time", "ms", ((_per_request_ms("nv_inference_queue_duration_us"), "{{model}}"),)),
    (
        "KV-cache usage",
        "percent",
        ((f"100 * {_kv('used')} / clamp_min({_kv('max')}, 1)", "used %"),),
    ),
    ("KV-cache blocks", "short", ((_kv("used"), "used"), (_kv("free"), "free"), (_kv("max"), "max"))),
    (
        "LLM requests",
        "short",
        tuple((f'sum(nv_trt_llm_request_metrics{{request_type="{kind}"}})', kind) for kind in ("active", "waiting", "scheduled")),
    ),
    ("Pending requests", "short", (("sum by (model) (nv_inference_pending_request_count)", "{{model}}"),)),
    ("Failures", "reqps", ((_rate("nv_inference_request_failure"), "{{model}}"),)),
    (
        "Tokens / s",
        "short",
        ((_tokens("generated"), "generated"), (_tokens("prompt_computed"), "prompt computed"), (_tokens("prompt_reused"), "prompt reused")),
    ),
    (
        "Prefix-cache hit rate (prompt tokens)",
        "percent",
        (
            (
                f"100 * {_tokens('prompt_reused')} / clamp_min({_tokens('prompt_reused')} + {_tokens('prompt_computed')}, 1e-9)",
                "reused %",
            ),
        ),
    ),
    (
        "Prefix hits and preemptions",
        "ops",
        (
            (_total_rate("trtllm_pipeline_prefix_cache_hits_total"), "prefix-cache hits"),
            (_total_rate("trtllm_pipeline_preemptions_total"), "preemptions"),
        ),
    ),
    (
        "Engine iterations / s",
        "short",
        ((_total_rate("nv_trt_llm_general_metrics", '{general_type="iteration_counter"}'), "iterations"),),
    ),
    # the OpenAI front end's histograms (no panel data on the llmapi target, whose OpenAI endpoint is trtllm-serve)
    ("Time to first token (OpenAI front end)", "ms", _front_end_latency(rules.TTFT_HISTOGRAM)),
    ("Inter-token latency (OpenAI front end)", "ms", _front_end_latency(rules.ITL_HISTOGRAM)),
)


def dashboard(spec: Spec, target: str) -> dict[str, Any]:
    datasource = {"type": "prometheus", "uid": DATASOURCE_UID}
    panels = []
    for index, (title, unit, queries) in enumerate(PANELS):
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": title,
                "datasource": dict(datasource),
                "gridPos": {"x": 12 * (index % 2), "y": 8 * (index // 2), "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
                "targets": [
                    {"refId": chr(ord("A") + i), "datasource": dict(datasource), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(queries)
                ],
            }
        )
    return {
        "uid": DASHBOARD_UID,
        "title": f"trtllm-pipeline: {spec.name} ({target})",
        "tags": ["trtllm-pipeline", "triton", target],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }

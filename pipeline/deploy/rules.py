"""Prometheus recording and alerting rules of a deployment, and the `promtool test rules` file that checks them.

Every kind renders the same groups: compose mounts prometheus/rules.yml into its Prometheus (rule_files
in prometheus.yml), kubernetes wraps them in a PrometheusRule. Series carry a `build` label (compose: a
static label of the scrape config; kubernetes: the pod label app.kubernetes.io/instance); Triton's
scrape job is `triton`, the project's OpenAI front end's `openai`.

Recording rules (from Triton's own families, triton-inference-server/server docs/user_guide/metrics.md, and the LLM model's gauges, which have
TensorRT-LLM's backend names on both targets: model_repo/python/engine_metrics.py):

    trtllm_pipeline:queue_to_compute:ratio_rate1m      the autoscaling signal of NVIDIA's Triton autoscaling tutorial:
        rate(nv_inference_queue_duration_us) / clamp_min(rate(nv_inference_compute_infer_duration_us), 1), of the LLM model
    trtllm_pipeline:queue_time_ms:mean_rate5m          mean queue time per successful request
    trtllm_pipeline:request_latency_ms:mean_rate5m     mean request time (a streamed request: until its last response)
    trtllm_pipeline:request_failure:ratio_rate5m       failed / (successful + failed) requests
    trtllm_pipeline:kv_cache_utilization:max           largest used/max KV-block fraction of any replica
    trtllm_pipeline:time_to_first_token_ms:p50_rate5m / :p90_rate5m
    trtllm_pipeline:inter_token_latency_ms:p50_rate5m / :p90_rate5m
        TTFT and inter-token latency from the OpenAI front end's histograms (clients/openai_server/metrics.py),
        as its clients see them, on both targets. Not from Triton: the bundled tritonserver 2.51 has no
        first-response histogram (its libtritonserver knows only summary_latencies), and Triton's counters see
        a decoupled request only whole. Requests sent to Triton directly are not in these.
    trtllm_pipeline:request_ms_per_generated_token:mean_rate5m
        an upper bound of the inter-token latency: the LLM's request time over its generated tokens (it includes
        prefill); cpu target only, whose model counts tokens (trtllm_pipeline_tokens_total)
"""

from __future__ import annotations

from typing import Any

from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec
from pipeline.deploy.server_command import LLM_MODEL

RULES_FILE = "prometheus/rules.yml"
RULES_TEST_FILE = "prometheus/rules.test.yml"
RULES_MOUNT = "/etc/prometheus/rules.yml"
TRITON_JOB = "triton"
OPENAI_JOB = "openai"
BUILD_LABEL = "build"
NOT_READY_FOR = "2m"

RATIO = "trtllm_pipeline:queue_to_compute:ratio_rate1m"
QUEUE_MS = "trtllm_pipeline:queue_time_ms:mean_rate5m"
LATENCY_MS = "trtllm_pipeline:request_latency_ms:mean_rate5m"
FAILURE_RATIO = "trtllm_pipeline:request_failure:ratio_rate5m"
KV_UTILIZATION = "trtllm_pipeline:kv_cache_utilization:max"
TTFT_MS = "trtllm_pipeline:time_to_first_token_ms"
ITL_MS = "trtllm_pipeline:inter_token_latency_ms"
# The front end's histograms (seconds); the names are clients.openai_server.metrics' (not imported: deploy stays light).
TTFT_HISTOGRAM = "trtllm_pipeline_openai_time_to_first_token_seconds"
ITL_HISTOGRAM = "trtllm_pipeline_openai_inter_token_latency_seconds"
QUANTILES = (("p50", 0.5), ("p90", 0.9))
MS_PER_TOKEN = "trtllm_pipeline:request_ms_per_generated_token:mean_rate5m"

_BY = f"sum by ({BUILD_LABEL}, model)"
_LLM = f'{{model="{LLM_MODEL}"}}'


def _rate(family: str, window: str, selector: str = "", by: str = _BY) -> str:
    return f"{by} (rate({family}{selector}[{window}]))"


def queue_to_compute_ratio(selector: str = _LLM, window: str = "1m", by: str = _BY) -> str:
    """NVIDIA's autoscaling signal, as a PromQL expression (also the prometheus-adapter rule's, with its own selector)."""
    return (
        f"{_rate('nv_inference_queue_duration_us', window, selector, by)} / "
        f"clamp_min({_rate('nv_inference_compute_infer_duration_us', window, selector, by)}, 1)"
    )


def runs_openai_front_end(spec: Spec) -> bool:
    """Whether the deployment runs the project's OpenAI front end (every target but llmapi, served by trtllm-serve):
    the TTFT / ITL rules read its histograms, so they exist only where it does."""
    return backend_for(spec.build.target).llm_api is None


def recording_rules(spec: Spec) -> list[dict[str, Any]]:
    success = _rate("nv_inference_request_success", "5m")
    failure = _rate("nv_inference_request_failure", "5m")
    tokens = f'sum by ({BUILD_LABEL}) (rate(trtllm_pipeline_tokens_total{{token_type="generated"}}[5m]))'
    llm_time = _rate("nv_inference_request_duration_us", "5m", _LLM, f"sum by ({BUILD_LABEL})")
    return [
        {"record": RATIO, "expr": queue_to_compute_ratio()},
        {"record": QUEUE_MS, "expr": f"{_rate('nv_inference_queue_duration_us', '5m')} / clamp_min({success}, 1e-9) / 1000"},
        {"record": LATENCY_MS, "expr": f"{_rate('nv_inference_request_duration_us', '5m')} / clamp_min({success}, 1e-9) / 1000"},
        {"record": FAILURE_RATIO, "expr": f"{failure} / clamp_min({success} + {failure}, 1e-9)"},
        {
            "record": KV_UTILIZATION,
            "expr": f'max by ({BUILD_LABEL}, instance) (nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction"}})',
        },
        *(_quantile_rules(TTFT_MS, TTFT_HISTOGRAM) + _quantile_rules(ITL_MS, ITL_HISTOGRAM) if runs_openai_front_end(spec) else []),
        {"record": MS_PER_TOKEN, "expr": f"{llm_time} / clamp_min({tokens}, 1e-9) / 1000"},
    ]


def _quantile_rules(record: str, histogram: str) -> list[dict[str, Any]]:
    buckets = f"sum by ({BUILD_LABEL}, le) (rate({histogram}_bucket[5m]))"
    return [{"record": f"{record}:{name}_rate5m", "expr": f"1000 * histogram_quantile({q:g}, {buckets})"} for name, q in QUANTILES]


def alerting_rules(spec: Spec) -> list[dict[str, Any]]:
    bounds = spec.deploy.alerts

    def alert(name: str, expr: str, pending: str, severity: str, summary: str, description: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": pending,
            "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description},
        }

    where = f"{{{{ $labels.{BUILD_LABEL} }}}}"
    return [
        alert(
            "TritonNotReady",
            f'up{{job="{TRITON_JOB}"}} == 0',
            NOT_READY_FOR,
            "critical",
            f"Triton of {where} is not serving",
            f"{{{{ $labels.instance }}}} has not answered its metrics scrape for {NOT_READY_FOR}: the server is down, or still loading its models.",
        ),
        alert(
            "TritonQueueTimeHigh",
            f"{QUEUE_MS} > {bounds.queue_time_ms:g}",
            bounds.pending_for,
            "warning",
            f"Requests of {where} wait in Triton's queue",
            f"Mean queue time of model {{{{ $labels.model }}}} exceeds deploy.alerts.queue_time_ms ({bounds.queue_time_ms:g} ms) (see {QUEUE_MS}).",
        ),
        alert(
            "TritonKVCacheNearlyFull",
            f"{KV_UTILIZATION} > {bounds.kv_cache_utilization:g}",
            bounds.pending_for,
            "warning",
            f"The KV cache of {where} is nearly full",
            f"{{{{ $labels.instance }}}} uses more than deploy.alerts.kv_cache_utilization ({bounds.kv_cache_utilization:g}) "
            "of its KV-cache blocks: new requests wait or preempt others.",
        ),
        alert(
            "TritonRequestFailures",
            f"{FAILURE_RATIO} > {bounds.failure_ratio:g}",
            bounds.pending_for,
            "critical",
            f"Requests of {where} fail",
            f"More than deploy.alerts.failure_ratio ({bounds.failure_ratio:g}) of the requests of model {{{{ $labels.model }}}} fail (see {FAILURE_RATIO}).",
        ),
    ]


def rule_groups(spec: Spec) -> list[dict[str, Any]]:
    return [
        {"name": "trtllm-pipeline.recording", "rules": recording_rules(spec)},
        {"name": "trtllm-pipeline.alerts", "rules": alerting_rules(spec)},
    ]


def rules_document(spec: Spec) -> dict[str, Any]:
    return {"groups": rule_groups(spec)}

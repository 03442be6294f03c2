"""The `promtool test rules` file rendered beside prometheus/rules.yml: synthetic Triton series for two builds,
`hot` (every bound of deploy.alerts exceeded twice over, and a scrape target down) and `calm` (half the bounds,
no failures), and what must follow: each alert fires for `hot` only, once its `for` has passed, and the
recording rules give the values the series imply (the queue-to-compute ratio is 10 by construction; the
OpenAI front end's TTFT and inter-token histograms put every observation in one bucket, so their medians are
that bucket's midpoint).

Run it where the deployment is: `promtool test rules prometheus/rules.test.yml`.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import rules
from pipeline.deploy.server_command import LLM_MODEL

SCRAPE_SECONDS = 15
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def _seconds(duration: str) -> int:
    number, unit = re.fullmatch(r"([0-9]+)([smh])", duration).groups()  # type: ignore[union-attr]
    return int(number) * _UNIT_SECONDS[unit]


def _counter(per_second: float, samples: int) -> str:
    return f"0+{per_second * SCRAPE_SECONDS:g}x{samples}"


def _series(build: str, queue_ms: float, failures: float, kv: float, samples: int) -> list[dict[str, str]]:
    """One replica of `build`: 1 successful request/s, `queue_ms` mean queue time, compute time a tenth of the queue
    time, `failures` failed/(all) requests, `kv` KV-cache fraction."""
    target = f'build="{build}",instance="{build}:8002",job="{rules.TRITON_JOB}"'
    llm = f'{target},model="{LLM_MODEL}"'
    queue_us_per_s = queue_ms * 1000
    failed_per_s = failures / (1 - failures)
    return [
        {"series": f"up{{{target}}}", "values": f"1x{samples}"},
        {"series": f"nv_inference_request_success{{{llm}}}", "values": _counter(1, samples)},
        {"series": f"nv_inference_request_failure{{{llm}}}", "values": _counter(failed_per_s, samples)},
        {"series": f"nv_inference_queue_duration_us{{{llm}}}", "values": _counter(queue_us_per_s, samples)},
        {"series": f"nv_inference_compute_infer_duration_us{{{llm}}}", "values": _counter(queue_us_per_s / 10, samples)},
        {
            "series": f'nv_trt_llm_kv_cache_block_metrics{{{target},kv_cache_block_type="fraction",model="{LLM_MODEL}"}}',
            "values": f"{kv:g}x{samples}",
        },
    ]


# (histogram, bucket holding every observation, the median the rules must record in ms: the bucket's midpoint)
FRONT_END_BUCKETS = ((rules.TTFT_HISTOGRAM, (0.5, 1.0), 750), (rules.ITL_HISTOGRAM, (0.25, 0.5), 375))


def _front_end_series(build: str, samples: int) -> list[dict[str, str]]:
    """The OpenAI front end of `build`: 4 observations/s of each histogram, all in its FRONT_END_BUCKETS bucket."""
    target = f'build="{build}",instance="{build}:9000",job="{rules.OPENAI_JOB}"'
    series = []
    for histogram, (low, high), _ in FRONT_END_BUCKETS:
        for bound, per_second in ((low, 0), (high, 4), ("+Inf", 4)):
            series.append({"series": f'{histogram}_bucket{{{target},le="{bound}"}}', "values": _counter(per_second, samples)})
    return series


def _expected(alert: dict[str, Any], labels: dict[str, str], spec: Spec) -> dict[str, Any]:
    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)

    return {
        "exp_labels": {**labels, **alert["labels"]},
        "exp_annotations": {key: fill(value) for key, value in alert["annotations"].items()},
    }


def rules_test_document(spec: Spec) -> dict[str, Any]:
    bounds = spec.deploy.alerts
    pending = max(_seconds(bounds.pending_for), _seconds(rules.NOT_READY_FOR))
    eval_seconds = pending + 180  # every `for` passed, and the 5m rate windows filled
    samples = eval_seconds // SCRAPE_SECONDS + 4
    hot_kv = min(1.0, bounds.kv_cache_utilization + (1 - bounds.kv_cache_utilization) / 2)
    hot_failures = min(0.99, bounds.failure_ratio * 2)
    series = _series("hot", bounds.queue_time_ms * 2, hot_failures, hot_kv, samples)
    series += _series("calm", bounds.queue_time_ms / 2, 0.0, bounds.kv_cache_utilization / 2, samples)
    series.append({"series": f'up{{build="hot",instance="hot-down:8002",job="{rules.TRITON_JOB}"}}', "values": f"0x{samples}"})
    front_end = rules.runs_openai_front_end(spec)
    if front_end:
        series += _front_end_series("hot", samples)
    by_name = {alert["alert"]: alert for alert in rules.alerting_rules(spec)}
    llm = {"build": "hot", "model": LLM_MODEL}
    fired = {
        "TritonNotReady": {"build": "hot", "instance": "hot-down:8002", "job": rules.TRITON_JOB},
        "TritonQueueTimeHigh": llm,
        "TritonRequestFailures": llm,
    }
    if hot_kv > bounds.kv_cache_utilization:  # a bound of 1.0 cannot be exceeded
        fired["TritonKVCacheNearlyFull"] = {"build": "hot", "instance": "hot:8002"}
    alert_tests = [
        {"eval_time": f"{eval_seconds}s", "alertname": name, "exp_alerts": [_expected(by_name[name], labels, spec)] if name in fired else []}
        for name, labels in ((name, fired.get(name, {})) for name in by_name)
    ]
    early = {"eval_time": f"{_seconds(bounds.pending_for) // 2}s", "alertname": "TritonQueueTimeHigh", "exp_alerts": []}
    recording = [
        {
            "expr": f'{rules.RATIO}{{build="hot"}}',
            "eval_time": f"{eval_seconds}s",
            "exp_samples": [{"labels": f'{rules.RATIO}{{build="hot",model="{LLM_MODEL}"}}', "value": 10}],
        },
        {
            "expr": f"{rules.KV_UTILIZATION}",
            "eval_time": f"{eval_seconds}s",
            "exp_samples": [
                {"labels": f'{rules.KV_UTILIZATION}{{build="{build}",instance="{build}:8002"}}', "value": value}
                for build, value in (("calm", bounds.kv_cache_utilization / 2), ("hot", hot_kv))
            ],
        },
    ]
    recording += [
        {
            "expr": f'{record}:p50_rate5m{{build="hot"}}',
            "eval_time": f"{eval_seconds}s",
            "exp_samples": [{"labels": f'{record}:p50_rate5m{{build="hot"}}', "value": median_ms}],
        }
        for record, (_, _, median_ms) in zip((rules.TTFT_MS, rules.ITL_MS), FRONT_END_BUCKETS)
        if front_end
    ]
    return {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": f"{SCRAPE_SECONDS}s", "input_series": series, "alert_rule_test": [early, *alert_tests], "promql_expr_test": recording}],
    }

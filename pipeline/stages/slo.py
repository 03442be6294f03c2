"""slo: the performance gate. Serves the packaged repository with the bundled tritonserver (cpu
target) — or measures the running deployment at gate.performance.url — under a closed-loop load
of gate.performance.concurrency streaming callers, checks the thresholds, and compares with the
last stored result of this build name. A failed gate seals its report (verdict "failed") and
stops the pipeline before deploy. Over the openai endpoint the load carries the first key of
TRTLLM_PIPELINE_API_KEYS when it is set (and a front end served here asks for those keys)."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from pipeline.config.spec import PerformanceGateSpec
from pipeline.errors import StageError
from pipeline.stages.base import StageContext

REPORT = "performance.json"


def run(ctx: StageContext) -> None:
    from pipeline.load.slo import regression, regression_failures, threshold_failures

    gate = ctx.spec.gate.performance
    if gate is None:  # the plan schedules this stage only with gate.performance
        raise StageError("the slo stage runs only for a build config with gate.performance")
    workload = workload_recipe(gate)
    if ctx.spec.dry_run and gate.url is None:
        report: dict[str, Any] = {
            "verdict": "not measured",
            "reason": "dry-run: no engine was built here; set gate.performance.url to a running deployment of this build",
            "workload": workload,
        }
        _seal(ctx, report, [])
        ctx.log("[yellow]not measured (dry-run); the gate holds nothing until it runs against a deployment[/yellow]")
        return
    previous = previous_report(ctx)
    result = _measure(ctx, gate)
    point = result["points"][0]
    change = regression(point, workload, previous)
    failures = threshold_failures(point, gate) + regression_failures(change, gate)
    report = {
        "verdict": "failed" if failures else "passed",
        "failures": failures,
        "digest": ctx.plan.digest,
        "workload": workload,
        "point": point,
        "regression": change,
        "thresholds": gate.model_dump(mode="json", exclude_none=True),
        "server_version": result.get("server_version"),
        "machine": result.get("machine"),
    }
    _seal(ctx, report, failures)
    ctx.console.print(_table(report))


def workload_recipe(gate: PerformanceGateSpec) -> dict[str, Any]:
    return {
        "endpoint": gate.endpoint.value,
        "concurrency": gate.concurrency,
        "num_requests": gate.num_requests,
        "warmup_requests": gate.warmup_requests,
        "input_tokens": gate.input_tokens,
        "output_tokens": gate.output_tokens,
        "seed": gate.seed,
    }


def previous_report(ctx: StageContext) -> dict[str, Any] | None:
    """The newest measured report of this stage for this build, from the store: this digest's own
    (when --force measures again) or another digest's (an earlier build)."""
    reports = []
    for ref in ctx.history():
        try:
            report = json.loads((ref.path / REPORT).read_text())
        except (OSError, ValueError):
            continue
        if report.get("point") is not None:
            reports.append({**report, "created": ref.manifest.get("created", "")})
    return reports[-1] if reports else None


def _measure(ctx: StageContext, gate: PerformanceGateSpec) -> dict[str, Any]:
    from clients.load import SloLimits
    from pipeline.load.remote import load_test_keys, remote_endpoints
    from pipeline.load.serving import serving
    from pipeline.load.sweep import SweepOptions, run_load_sweep
    from pipeline.load.workload import LengthDist, TextTokenizer, synthetic_requests

    spec = ctx.spec
    goodput = gate.goodput
    options = SweepOptions(
        endpoints=(gate.endpoint.value,),
        concurrencies=(gate.concurrency,),
        requests_per_point=gate.num_requests,
        warmup=gate.warmup_requests,
        slo=SloLimits(goodput.ttft_ms, goodput.itl_ms, goodput.e2e_ms) if goodput else SloLimits(),
        seed=gate.seed,
    )
    requests = synthetic_requests(
        TextTokenizer(ctx.upstream["prepare"].path),
        gate.num_requests,
        input_tokens=LengthDist(gate.input_tokens),
        output_tokens=LengthDist(gate.output_tokens),
        max_input_len=spec.build.max_input_len,
        max_output_len=gate.output_tokens,
        seed=gate.seed,
    )
    keys = load_test_keys(None) if gate.endpoint.value == "openai" else None
    ctx.log(f"{gate.num_requests} requests of {gate.input_tokens}→{gate.output_tokens} tokens, {gate.concurrency} concurrent, over {gate.endpoint.value}")
    if gate.url is not None:
        endpoints = remote_endpoints(spec, gate.endpoint.value, gate.url, api_key=keys[0].secret if keys else None)
        return run_load_sweep(endpoints, requests, options)
    repo = ctx.upstream["package"].repository_dir
    with serving(repo, spec.deploy, model_name=spec.name, openai=gate.endpoint.value == "openai", say=ctx.log, api_keys=keys) as endpoints:
        return run_load_sweep(endpoints, requests, options)


def _seal(ctx: StageContext, report: dict[str, Any], failures: list[str]) -> None:
    (ctx.out_dir / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    ctx.notes.update(verdict=report["verdict"], failures=failures)


def _table(report: dict[str, Any]) -> Table:
    point = report["point"]
    table = Table(title=f"performance gate: {report['verdict']}", title_justify="left")
    for column in ("metric", "p50", "p90", "p99"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
        values = point.get(metric) or {}
        table.add_row(metric, *(f"{values.get(q, float('nan')):.2f}" for q in ("p50", "p90", "p99")))
    table.caption = (
        f"{point['output_tokens_per_s']:.1f} output tokens/s · {point['requests_per_s']:.2f} requests/s · "
        f"{point['good_requests']}/{point['requests']} good"
        + (f" · regression {report['regression']['worse_pct']}" if (report.get("regression") or {}).get("comparable") else "")
    )
    return table

"""gate.performance: its spec errors, the threshold and regression arithmetic, the plan and the
preflight. The gate run against a real tritonserver is in tests/integration/test_load_and_slo.py."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from pipeline.config.loader import load_config
from pipeline.config.spec import PerformanceGateSpec
from pipeline.errors import SpecError
from pipeline.load.slo import regression, regression_failures, threshold_failures
from pipeline.plan import EnvFacts, plan
from pipeline.preflight import preflight
from tests.conftest import MINIMAL_CONFIG, write_model_config


def config_with_gate(tmp_path: Path, gate: str, *, build_extra: str = "") -> Path:
    write_model_config(tmp_path / "model")
    text = MINIMAL_CONFIG + build_extra + "gate:\n  performance:\n" + textwrap.indent(textwrap.dedent(gate), "    ")
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def spec_error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path)
    return info.value.message


def point(**overrides) -> dict:
    base = {
        "requests": 10,
        "completed": 10,
        "failed": 0,
        "errors": {},
        "ttft_ms": {"p50": 40.0, "p90": 60.0, "p99": 80.0},
        "itl_ms": {"p50": 10.0, "p90": 12.0, "p99": 14.0},
        "e2e_ms": {"p50": 300.0, "p90": 400.0, "p99": 450.0},
        "output_tokens_per_s": 300.0,
        "requests_per_s": 9.0,
        "good_requests": 9,
        "slo": {"ttft_ms": 50.0},
    }
    base.update(overrides)
    return base


def gate(**fields) -> PerformanceGateSpec:
    return PerformanceGateSpec(**fields)


def test_a_gate_without_any_threshold_is_refused(tmp_path):
    message = spec_error(config_with_gate(tmp_path, "concurrency: 2\n"))
    assert "gate.performance" in message and "set at least one threshold" in message


def test_latency_limits_need_a_percentile_and_positive_values(tmp_path):
    assert "set at least one of p50, p90, p99" in spec_error(config_with_gate(tmp_path, "max_ttft_ms: {}\n"))
    message = spec_error(config_with_gate(tmp_path, "max_ttft_ms: {p99: -5}\n"))
    assert "gate.performance.max_ttft_ms.p99" in message and "-5" in message


def test_unknown_gate_field_is_named_with_its_line(tmp_path):
    message = spec_error(config_with_gate(tmp_path, "max_ttft_ms: {p99: 100}\nmax_ttft_p99: 100\n"))
    assert "max_ttft_p99" in message and "cfg.yaml:" in message


def test_prompt_longer_than_the_engine_takes_is_refused(tmp_path):
    message = spec_error(config_with_gate(tmp_path, "input_tokens: 300\nmin_requests_per_s: 1\n"))
    assert "gate.performance.input_tokens (300) exceeds build.max_input_len (256)" in message
    message = spec_error(config_with_gate(tmp_path, "input_tokens: 200\noutput_tokens: 400\nmin_requests_per_s: 1\n"))
    assert "exceeds build.max_seq_len (512)" in message


def test_the_slo_stage_is_planned_between_package_and_deploy_and_feeds_deploy(tmp_path):
    loaded = load_config(config_with_gate(tmp_path, "min_requests_per_s: 1\n"))
    the_plan = plan(loaded.spec, EnvFacts(tools={}, model_fingerprint="m"))
    names = list(the_plan.names())
    assert names.index("package") < names.index("slo") < names.index("deploy")
    deploy = next(stage for stage in the_plan.stages if stage.name == "deploy")
    assert "slo" in deploy.upstream
    without = plan(
        load_config(config_with_gate(tmp_path, "min_requests_per_s: 1\n")).spec.model_copy(
            update={"gate": loaded.spec.gate.model_copy(update={"performance": None})}
        ),
        EnvFacts(tools={}, model_fingerprint="m"),
    )
    assert "slo" not in without.names()


def test_the_engine_target_needs_a_url_to_measure_unless_dry_run(tmp_path):
    from pipeline.config.spec import Target

    loaded = load_config(config_with_gate(tmp_path, "min_requests_per_s: 1\n"))
    engine = loaded.spec.model_copy(update={"build": loaded.spec.build.model_copy(update={"target": Target.engine})})
    [(path, message)] = preflight(engine, loaded.model, ["slo"])
    assert path == ("gate", "performance", "url") and "gate.performance.url" in message


def test_every_missed_threshold_is_named_with_value_and_limit():
    failures = threshold_failures(
        point(),
        gate(
            max_ttft_ms={"p50": 30, "p99": 100},
            max_itl_ms={"p99": 13},
            max_e2e_ms={"p90": 500},
            min_output_tokens_per_s=400,
            min_requests_per_s=5,
            goodput={"ttft_ms": 50, "min_pct": 95},
        ),
    )
    assert failures == [
        "ttft_ms p50 40.00 ms exceeds gate.performance.max_ttft_ms.p50 30.0 ms",
        "itl_ms p99 14.00 ms exceeds gate.performance.max_itl_ms.p99 13.0 ms",
        "output_tokens_per_s 300.00 tokens/s is below gate.performance.min_output_tokens_per_s 400.0",
        "goodput 90.0% of requests met the SLO {'ttft_ms': 50.0}, below gate.performance.goodput.min_pct 95.0%",
    ]


def test_thresholds_just_above_the_measurement_pass():
    assert threshold_failures(point(), gate(max_ttft_ms={"p99": 80.01}, min_output_tokens_per_s=299.9)) == []


def test_failed_requests_fail_the_gate_whatever_the_thresholds():
    [failure] = threshold_failures(point(failed=2, errors={"RequestError: boom": 2}), gate(min_requests_per_s=1))
    assert failure.startswith("2 of 10 requests failed: RequestError: boom")


def test_regression_is_reported_in_percent_positive_when_worse():
    workload = {"endpoint": "grpc", "concurrency": 4, "num_requests": 10, "input_tokens": 64, "output_tokens": 32, "seed": 0}
    previous = {"digest": "abc", "workload": workload, "point": point(output_tokens_per_s=400.0, ttft_ms={"p99": 40.0}, itl_ms={"p99": 14.0})}
    change = regression(point(), workload, previous)
    assert change["comparable"] and change["against"] == "abc"
    assert change["worse_pct"] == {"ttft_ms.p99": 100.0, "itl_ms.p99": 0.0, "output_tokens_per_s": 25.0}
    assert regression_failures(change, gate(max_regression_pct=50)) == [
        "ttft_ms.p99 is 100.0% worse than the stored result abc (gate.performance.max_regression_pct 50.0%)"
    ]
    assert regression_failures(change, gate(min_requests_per_s=1)) == []  # reported, not gated


def test_a_different_workload_is_not_compared():
    workload = {"endpoint": "grpc", "concurrency": 4}
    previous = {"digest": "abc", "workload": {"endpoint": "grpc", "concurrency": 8}, "point": point()}
    assert regression(point(), workload, previous) == {"comparable": False, "against": "abc", "why": "a different workload"}
    assert regression(point(), workload, None) is None


def test_the_previous_report_is_the_newest_measured_one_the_store_holds(tmp_path):
    from rich.console import Console

    from pipeline.artifacts import ArtifactRef
    from pipeline.plan import StagePlan
    from pipeline.stages.base import StageContext
    from pipeline.stages.slo import REPORT, previous_report

    def stored(digest: str, created: str, report: dict | None) -> ArtifactRef:
        path = tmp_path / f"slo-{digest}"
        path.mkdir()
        if report is not None:
            (path / REPORT).write_text(json.dumps(report))
        return ArtifactRef("slo", digest, path, {"created": created})

    history = (
        stored("a" * 16, "2026-01-01T00:00:00Z", {"verdict": "passed", "point": point(), "digest": "a" * 16}),
        stored("b" * 16, "2026-01-02T00:00:00Z", {"verdict": "failed", "point": point(failed=1), "digest": "b" * 16}),
        stored("c" * 16, "2026-01-03T00:00:00Z", {"verdict": "not measured", "workload": {}}),
        stored("d" * 16, "2026-01-04T00:00:00Z", None),
    )
    ctx = StageContext(
        spec=None,
        model=None,
        plan=StagePlan("slo", "e" * 16, {}, {}, {}, "slo"),
        upstream={},
        out_dir=tmp_path,
        console=Console(quiet=True),
        history=lambda: history,
    )
    assert previous_report(ctx) == {"verdict": "failed", "point": point(failed=1), "digest": "b" * 16, "created": "2026-01-02T00:00:00Z"}
    assert previous_report(dataclasses.replace(ctx, history=lambda: ())) is None

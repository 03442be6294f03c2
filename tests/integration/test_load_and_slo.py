"""The load benchmark and the performance gate against the real tritonserver (cpu target)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.serving import CLI, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLO_CONFIG = str(REPO / "build_configs" / "tiny-cpu-slo.yaml")


def cli(root, *argv, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(CLI), "--artifacts", str(root), *argv], capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result


def test_a_concurrency_sweep_over_grpc_and_http_writes_json_and_a_plot(private_tiny_cpu, tmp_path):
    out = tmp_path / "results"
    result = cli(  # on a copy of the session's build: the stages are cached, only the bench runs
        private_tiny_cpu["root"],
        "bench",
        "load",
        str(REPO / "build_configs" / "tiny-cpu.yaml"),
        "--endpoint",
        "grpc,http",
        "--concurrency",
        "1,3",
        "--requests",
        "6",
        "--warmup",
        "1",
        "--input-tokens",
        "24",
        "--output-tokens",
        "8",
        "--slo-ttft-ms",
        "60000",
        "--json",
        "--out",
        str(out),
    )
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "bench-serve-load.json").read_text())
    assert (out / "bench-serve-load.png").read_bytes()[:4] == b"\x89PNG"
    assert [(p["endpoint"], p["mode"]["concurrency"]) for p in printed["points"]] == [("grpc", 1), ("http", 1), ("grpc", 3), ("http", 3)]
    for point in printed["points"]:
        assert point["failed"] == 0 and point["completed"] == 6, point["errors"]
        assert point["output_tokens"] == 6 * 8  # min_tokens = max_tokens: every request runs its full length
        assert 0 < point["ttft_ms"]["p50"] < point["e2e_ms"]["p50"]
        assert point["itl_ms"]["p50"] > 0
        assert point["good_requests"] == 6
        assert 16 <= point["mean_input_tokens"] <= 32


def unmissable(ceiling: int) -> list[str]:
    """--set overrides that put every threshold of tiny-cpu-slo.yaml where no machine, however loaded, misses it
    (latencies up to `ceiling` ms, any throughput above 0, any regression): the gate's verdict is then the test's
    choice, not the machine's. A different `ceiling` is a different build digest, so the slo stage runs again."""
    return [
        argument
        for setting in (
            f"gate.performance.max_ttft_ms.p50={ceiling}",
            f"gate.performance.max_ttft_ms.p99={ceiling}",
            f"gate.performance.max_itl_ms.p99={ceiling}",
            "gate.performance.min_output_tokens_per_s=0.001",
            f"gate.performance.goodput.ttft_ms={ceiling}",
            f"gate.performance.goodput.itl_ms={ceiling}",
            f"gate.performance.max_regression_pct={ceiling}",
        )
        for argument in ("--set", setting)
    ]


def test_the_performance_gate_passes_and_fails_on_purpose(tmp_path):
    """The gate's mechanism, not this machine's speed: thresholds no measurement can miss pass (and the second run is
    compared with the first), a throughput floor no CPU reaches fails naming metric, value and threshold and stops the
    pipeline before deploy. The example config's own thresholds are for a quiet machine (`bench load` measures)."""
    root = tmp_path / "artifacts"
    cli(root, "run", SLO_CONFIG, "--until", "slo", *unmissable(600_000))
    [first] = root.glob("tiny-cpu-slo/slo-*/performance.json")
    measured = json.loads(first.read_text())
    assert measured["verdict"] == "passed" and measured["regression"] is None
    assert measured["point"]["output_tokens_per_s"] > 0 and measured["point"]["failed"] == 0

    passing = cli(root, "run", SLO_CONFIG, "--until", "slo", *unmissable(500_000))
    assert "performance gate: passed" in passing.stdout
    second = max(root.glob("tiny-cpu-slo/slo-*/performance.json"), key=lambda p: p.stat().st_mtime)
    report = json.loads(second.read_text())
    assert report["regression"]["comparable"] and set(report["regression"]["worse_pct"]) == {"ttft_ms.p99", "itl_ms.p99", "output_tokens_per_s"}

    # A throughput floor above what any CPU does with this model: fails, names metric, value and threshold; deploy does not run.
    floor = "1000000"
    failing = cli(root, "run", SLO_CONFIG, *unmissable(400_000), "--set", f"gate.performance.min_output_tokens_per_s={floor}", check=False)
    assert failing.returncode == 1
    assert "slo failed: output_tokens_per_s" in failing.stderr
    assert f"is below gate.performance.min_output_tokens_per_s {float(floor)}" in failing.stderr
    assert not list(root.glob("tiny-cpu-slo/deploy-*"))
    failed_reports = [json.loads(p.read_text()) for p in root.glob("tiny-cpu-slo/slo-*/performance.json")]
    assert sorted(r["verdict"] for r in failed_reports) == ["failed", "passed", "passed"]

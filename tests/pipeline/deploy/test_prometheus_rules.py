"""The Prometheus rules every deploy kind renders (pipeline.deploy.rules): a golden file, the families they read
against what the servers export, and Prometheus' own checker where it is installed: `promtool check config`,
`check rules` and `test rules` (the rendered test file: every alert fires for the over-bound build only).
promtool comes from Debian's `prometheus` package; without it those tests skip and say so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.config.spec import Spec
from pipeline.deploy import files, layout, rules
from tests.pipeline.deploy.test_deploy import GOLDEN, check_golden, load_spec

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")

# Triton 2.51's families on a CPU-only server (as its /metrics lists them), the LLM model's (engine_metrics.py, with the
# TensorRT-LLM backend's names), and the OpenAI front end's histograms (read from its own exposition below).
TRITON_EXPORTED = {
    "up",
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_trt_llm_kv_cache_block_metrics",
    "trtllm_pipeline_tokens_total",
}


def front_end_exported() -> set[str]:
    from clients.openai_server.metrics import FrontEndMetrics

    return {line.split("{")[0].split(" ")[0] for line in FrontEndMetrics().exposition().splitlines() if not line.startswith("#")}


EXPORTED = TRITON_EXPORTED | front_end_exported()


def with_bounds(spec: Spec, **bounds: object) -> Spec:
    data = spec.model_dump(mode="json")
    data["deploy"]["alerts"] = {**data["deploy"]["alerts"], **bounds}
    return Spec.model_validate(data)


def write_rules(spec: Spec, out: Path) -> Path:
    files.write_monitoring(out, spec, spec.build.target.value)
    return out / "prometheus"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_match_golden_file():
    check_golden(GOLDEN / "tiny-cpu.rules.yml", yaml.safe_dump(rules.rules_document(load_spec("tiny-cpu")), sort_keys=False, width=4096))


def test_rules_read_only_families_the_servers_export():
    document = rules.rules_document(load_spec("llama-3.1-8b-fp8"))
    recorded = {rule["record"] for group in document["groups"] for rule in group["rules"] if "record" in rule}
    read = set()
    for group in document["groups"]:
        for rule in group["rules"]:
            names = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{|\[)", rule["expr"]))
            read |= names - recorded
    assert read <= EXPORTED, read - EXPORTED
    assert "nv_inference_queue_duration_us" in read and "nv_inference_compute_infer_duration_us" in read
    assert {f"{rules.TTFT_HISTOGRAM}_bucket", f"{rules.ITL_HISTOGRAM}_bucket"} <= read  # TTFT / ITL: the front end's


def test_the_ttft_and_itl_rules_name_the_front_ends_histograms():
    from clients.openai_server import metrics

    assert (rules.TTFT_HISTOGRAM, rules.ITL_HISTOGRAM) == (metrics.TTFT, metrics.ITL)


def test_alert_bounds_come_from_the_spec():
    spec = with_bounds(load_spec("tiny-cpu"), queue_time_ms=250, kv_cache_utilization=0.8, failure_ratio=0.01, pending_for="2m")
    alerts = {rule["alert"]: rule for rule in rules.alerting_rules(spec)}
    assert alerts["TritonQueueTimeHigh"]["expr"].endswith("> 250")
    assert alerts["TritonKVCacheNearlyFull"]["expr"].endswith("> 0.8")
    assert alerts["TritonRequestFailures"]["expr"].endswith("> 0.01")
    assert {alerts[name]["for"] for name in ("TritonQueueTimeHigh", "TritonKVCacheNearlyFull", "TritonRequestFailures")} == {"2m"}


def test_prometheus_config_loads_the_rules_beside_it(tmp_path):
    directory = write_rules(load_spec("tiny-cpu"), tmp_path)
    config = yaml.safe_load((directory / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yml"] and (directory / "rules.yml").is_file()
    assert Path(rules.RULES_MOUNT).parent == Path("/etc/prometheus") and Path(layout.PROMETHEUS_CONFIG).name == "prometheus.yml"


@needs_promtool
@pytest.mark.parametrize(
    "bounds",
    [{}, {"queue_time_ms": 40, "kv_cache_utilization": 1.0, "failure_ratio": 0.5, "pending_for": "1m"}],
    ids=["defaults", "other-bounds"],
)
def test_promtool_checks_and_tests_the_rendered_rules(tmp_path, bounds):
    directory = write_rules(with_bounds(load_spec("tiny-cpu"), **bounds), tmp_path)
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "rules.yml"), ("test", "rules", "rules.test.yml")):
        result = promtool(*args, cwd=directory)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS: 14 rules found" in promtool("check", "rules", "rules.yml", cwd=directory).stdout


@needs_promtool
def test_promtool_test_fails_when_an_alert_cannot_fire(tmp_path):
    directory = write_rules(load_spec("tiny-cpu"), tmp_path)
    text = (directory / "rules.yml").read_text()
    (directory / "rules.yml").write_text(text.replace("mean_rate5m > 500", "mean_rate5m > 5000"))
    result = promtool("test", "rules", "rules.test.yml", cwd=directory)
    assert result.returncode != 0 and "TritonQueueTimeHigh" in result.stdout + result.stderr

"""The accuracy gate: passes and fails on purpose, names metric/value/threshold, marks the quantized artifact."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.artifacts import ArtifactStore, read_manifest
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.runner import GateFailed, make_plan, run_pipeline
from tests.conftest import DEFAULT_MODEL, REPO

pytestmark = pytest.mark.slow

CONFIG = f"""\
name: gated
model:
  source: {DEFAULT_MODEL}
quantize:
  algo: int8_wo
build:
  target: cpu
  max_batch_size: 8
  max_input_len: 256
  max_seq_len: 512
  max_num_tokens: 1024
gate:
  accuracy:
    heldout_files: ["{REPO / "data" / "heldout" / "*.txt"}"]
    num_windows: 4
    window_len: 128
    max_perplexity_increase_pct: 2.0
    min_token_agreement: 0.9
"""


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gate")
    path = root / "gated.yaml"
    path.write_text(textwrap.dedent(CONFIG))
    return path, root / "artifacts"


def _run(path: Path, artifacts: Path, *overrides: str):
    loaded = load_config(path, overrides)
    return {r.name: r for r in run_pipeline(loaded, ArtifactStore(artifacts, "gated"), console=Console(quiet=True))}


def test_gate_is_planned_only_when_configured(gated) -> None:
    path, _ = gated
    assert make_plan(load_config(path)).names() == ("prepare", "quantize", "build", "gate", "package", "deploy")
    plain = load_config(REPO / "build_configs" / "tiny-cpu.yaml")
    assert "gate" not in make_plan(plain).names()


def test_gate_passes_and_writes_a_report(gated) -> None:
    path, artifacts = gated
    results = _run(path, artifacts)
    report = json.loads((results["gate"].ref.path / "accuracy.json").read_text())
    assert report["verdict"] == "passed" and report["failures"] == []
    assert report["token_agreement"] >= 0.9 and abs(report["perplexity_increase_pct"]) <= 2.0
    assert report["baseline_perplexity"] > 1 and report["tokens_scored"] == 4 * 127
    quantize_manifest = read_manifest(results["quantize"].ref.path)
    assert quantize_manifest["gates"]["accuracy"]["verdict"] == "passed"


def test_gate_fails_on_purpose_naming_metric_value_and_threshold(gated, capsys: pytest.CaptureFixture[str]) -> None:
    path, artifacts = gated
    strict = ["--set", "gate.accuracy.min_token_agreement=1.0", "--set", "gate.accuracy.max_perplexity_increase_pct=0.0"]
    assert main(["--artifacts", str(artifacts), "run", str(path), *strict]) == 1
    err = capsys.readouterr().err
    assert "gate failed:" in err
    assert "is below gate.accuracy.min_token_agreement 1.0" in err or "exceeds gate.accuracy.max_perplexity_increase_pct 0.0%" in err
    with pytest.raises(GateFailed, match=r"gate failed \(cached verdict\)"):
        _run(path, artifacts, "gate.accuracy.min_token_agreement=1.0", "gate.accuracy.max_perplexity_increase_pct=0.0")
    quantize_dirs = [p for p in (artifacts / "gated").iterdir() if p.name.startswith("quantize-")]
    assert len(quantize_dirs) == 1  # the quantized artifact stays, marked failed
    assert read_manifest(quantize_dirs[0])["gates"]["accuracy"]["verdict"] == "failed"
    # Nothing is packaged from the failed gate: the only repository is the one the passing gate allowed.
    packages = list((artifacts / "gated").glob("package-*"))
    assert len(packages) == 1 and read_manifest(packages[0])["upstream"]["gate"] != read_manifest(quantize_dirs[0])["gates"]["accuracy"]["gate_digest"]

"""The accuracy gate on a published (pre-quantized) model.source: its quantized codes are no unquantized baseline, so
validate asks for gate.accuracy.baseline (naming the field), and the gate scores the published checkpoint against that
checkpoint: the same numbers as scoring the project's own FP8 conversion against the default model it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import DEFAULT_MODEL, REPO
from tests.support import prequantized_fixtures as fx
from tests.support.published_checkpoint import own_fp8_export, published_config, run_until

pytestmark = pytest.mark.slow


def _gate(baseline: Path | None = None) -> str:
    text = f"""gate:
  accuracy:
    heldout_files: ["{REPO / "data" / "heldout" / "*.txt"}"]
    num_windows: 4
    window_len: 64
    max_perplexity_increase_pct: 100.0
    min_token_agreement: 0.0
"""
    return text + (f"    baseline: {baseline}\n" if baseline is not None else "")


@pytest.fixture(scope="module")
def own_fp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return own_fp8_export(tmp_path_factory.mktemp("own-fp8"))


def _refusal(config: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_config(config)
    return info.value.message


def test_a_gate_on_a_published_checkpoint_without_a_baseline_is_refused_naming_the_field(own_fp8, tmp_path: Path) -> None:
    message = _refusal(published_config(tmp_path, own_fp8[1], extra=_gate()))
    assert "gate.accuracy.baseline is not set, but model.source" in message and str(own_fp8[1]) in message
    assert "ModelOpt FP8" in message and "its quantized codes are no unquantized baseline" in message
    assert "set gate.accuracy.baseline to the unquantized checkpoint it was quantized from" in message


def test_a_baseline_must_be_the_same_model_unquantized(own_fp8, tmp_path: Path) -> None:
    message = _refusal(published_config(tmp_path, own_fp8[1], extra=_gate(own_fp8[1])))
    assert f"gate.accuracy.baseline {own_fp8[1]} is itself pre-quantized (ModelOpt FP8" in message
    other = fx.tiny_qwen2(tmp_path / "other")
    message = _refusal(published_config(tmp_path, own_fp8[1], extra=_gate(other)))
    assert f"gate.accuracy.baseline {other / 'config.json'} is not the model of model.source: its architecture is 'Qwen2ForCausalLM'" in message
    message = _refusal(published_config(tmp_path, own_fp8[1], extra=_gate(tmp_path / "missing")))
    assert f"gate.accuracy.baseline: cannot read {tmp_path / 'missing' / 'config.json'}" in message


def test_a_baseline_on_an_unquantized_source_is_refused(tmp_path: Path) -> None:
    message = _refusal(published_config(tmp_path, DEFAULT_MODEL, algo="int8_wo", extra=_gate(DEFAULT_MODEL)))
    assert "gate.accuracy.baseline is set" in message and "the gate scores the quantized model against model.source itself" in message


def test_the_gate_scores_the_published_checkpoint_against_the_baseline(own_fp8, tmp_path: Path) -> None:
    from pipeline.backends.cpu.accuracy import compare_checkpoints
    from pipeline.quantization.modelopt_export import export_trtllm_checkpoint
    from pipeline.stages.gate import heldout_windows

    config = published_config(tmp_path, own_fp8[1], extra=_gate(DEFAULT_MODEL))
    results = run_until(config, tmp_path / "artifacts", "gate")
    report = json.loads((results["gate"].ref.path / "accuracy.json").read_text())
    assert (report["quant_algo"], report["kv_cache"], report["baseline"]) == ("fp8", "fp8", str(DEFAULT_MODEL))
    # the same scoring, by hand: the default model's export against the project's own FP8 conversion
    windows = heldout_windows(load_config(config).spec.gate.accuracy, results["prepare"].ref.path)
    export_trtllm_checkpoint(DEFAULT_MODEL, tmp_path / "unquantized", dtype="float16", tp_size=1, pp_size=1)
    metrics = compare_checkpoints(tmp_path / "unquantized", own_fp8[0], windows)
    assert report["baseline_perplexity"] == metrics.baseline_perplexity and report["perplexity"] == metrics.perplexity
    assert report["token_agreement"] == metrics.token_agreement and report["tokens_scored"] == metrics.tokens_scored
    # the FP8 codes read as plain weights would score nowhere near the baseline
    assert abs(report["perplexity_increase_pct"]) < 50 and report["token_agreement"] > 0.5

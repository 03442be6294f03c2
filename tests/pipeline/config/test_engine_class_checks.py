"""The engine target's refusals where TensorRT-LLM 1.2's class for a family would build another model
(pipeline/config/engine_class_checks.py), through `validate` on tiny random checkpoints made with transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from tests.conftest import BUILD_CONFIGS
from tests.support.family_models import make_family_checkpoint

CONFIGS = {"cpu": "tiny-cpu.yaml", "engine": "llama-3.1-8b-fp8.yaml", "llmapi": "llama-3.1-8b-fp8-llmapi.yaml"}
LENGTHS = ("--set", "build.max_seq_len=2048", "--set", "build.max_input_len=1024")
GEMMA3_SCALED = {
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-class")
    return {
        "phi3": make_family_checkpoint("phi3", root / "phi3"),
        "gemma3_text": make_family_checkpoint("gemma3_text", root / "gemma3"),
        "gemma3_scaled": make_family_checkpoint("gemma3_text", root / "gemma3-scaled", **GEMMA3_SCALED),
    }


def _validate(model: Path, target: str, *overrides: str, capsys) -> tuple[int, str]:
    code = main(["validate", str(BUILD_CONFIGS / CONFIGS[target]), "--set", f"model.source={model}", *LENGTHS, *overrides])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


PP2 = ("--set", "build.pp_size=2", "--set", "deploy.gpus=[0,1]")


def test_phi3_pipeline_stages_are_refused_on_the_engine_target(models, capsys):
    code, output = _validate(models["phi3"], "engine", *PP2, capsys=capsys)
    assert code == 2, output
    assert "build.pp_size=2: build.pp_size 2 is not built for phi3 on build.target engine" in output
    assert "Phi3ForCausalLM has no pipeline stages" in output and "build.target llmapi or cpu" in output


@pytest.mark.parametrize("target", ["engine", "llmapi"])
def test_phi3_without_pipeline_stages_and_on_other_targets_is_taken(models, target, capsys):
    code, output = _validate(models["phi3"], target, *((PP2) if target == "llmapi" else ()), capsys=capsys)
    assert code == 0, output


def test_gemma3_with_rope_scaling_is_refused_on_the_engine_target(models, capsys):
    code, output = _validate(models["gemma3_scaled"], "engine", capsys=capsys)
    assert code == 2, output
    assert "build.target: gemma3_text with rope_scaling linear x8.0" in output
    assert "applies the scaling to the local (sliding-window) layers' RoPE too" in output and "use build.target llmapi or cpu" in output


@pytest.mark.parametrize(("model", "target"), [("gemma3_scaled", "llmapi"), ("gemma3_scaled", "cpu"), ("gemma3_text", "engine")])
def test_gemma3_runs_where_its_rope_is_computed_as_the_model_does(models, model, target, capsys):
    code, output = _validate(models[model], target, capsys=capsys)
    assert code == 0, output


@pytest.fixture(scope="module")
def biased(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints whose Linears carry biases: Gemma with attention_bias (GemmaConfig declares none), Llama with
    attention_bias and mlp_bias (LLaMAConfig declares both)."""
    root = tmp_path_factory.mktemp("biased")
    return {
        "gemma": make_family_checkpoint("gemma", root / "gemma", attention_bias=True),
        "llama": make_family_checkpoint("llama", root / "llama", attention_bias=True, mlp_bias=True),
    }


def test_a_bias_the_tensorrt_llm_class_does_not_declare_is_refused_on_the_engine_target(biased, capsys):
    code, output = _validate(biased["gemma"], "engine", capsys=capsys)
    assert code == 2, output
    assert "build.target: model.layers.0.self_attn.k_proj.bias (and 7 more bias tensors)" in output
    assert "TensorRT-LLM 1.2's GemmaForCausalLM declares no such bias for gemma" in output and "use build.target llmapi or cpu" in output
    code, output = _validate(biased["gemma"], "cpu", capsys=capsys)
    assert "declares no such bias" not in output


def test_biases_the_class_declares_are_taken(biased, capsys):
    code, output = _validate(biased["llama"], "engine", capsys=capsys)
    assert code == 0, output

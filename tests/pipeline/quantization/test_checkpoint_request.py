"""What the quantize stage asks the job for (quantize_dispatch.checkpoint_request, read from a Spec in the pipeline
process), and the family table's format refusals where the checkpoint is written (modelopt_export).

The job inside NVIDIA's image cannot import pipeline.config, so the family table is read here: checkpoint_request
carries the TensorRT-LLM config (or `unified_only`) and refuses what the table refuses on build.target;
export_trtllm_checkpoint, called without a checkpoint config, reads the table itself and refuses a format the family
cannot take on trtllm-build, before any weights load (the checkpoints below have none).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.spec import Spec
from pipeline.errors import StageError
from pipeline.quantization.dispatch import checkpoint_request
from tests.support.family_models import _COMMON, FAMILY_CONFIGS


def _config_only(model_type: str, directory: Path) -> Path:
    """A checkpoint directory with config.json and no weights: loading it would fail, so a refusal came first."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **{**_COMMON, **FAMILY_CONFIGS[model_type]})
    config.architectures = [
        {"gpt_oss": "GptOssForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM", "starcoder2": "Starcoder2ForCausalLM"}[model_type]
    ]
    config.save_pretrained(directory)
    return directory


def _spec(source: Path, target: str, algo: str, kv_cache: str = "none", tp: int = 1) -> Spec:
    return Spec.model_validate(
        {
            "name": "request",
            "model": {"source": str(source), "dtype": "bfloat16"},
            "build": {"target": target, "max_input_len": 256, "max_seq_len": 512, "max_num_tokens": 1024, "tp_size": tp},
            "quantize": {"algo": algo, "kv_cache": kv_cache, "calibration": {"files": [str(source / "*.txt")]}},
        }
    )


def test_llmapi_takes_gpt_oss_as_its_unified_checkpoint_only(tmp_path: Path) -> None:
    hf_dir = _config_only("gpt_oss", tmp_path / "gpt_oss")
    assert checkpoint_request(_spec(hf_dir, "llmapi", "fp8"), hf_dir) == (None, True)


def test_engine_qwen3_moe_request_carries_the_moe_checkpoint_config(tmp_path: Path) -> None:
    hf_dir = _config_only("qwen3_moe", tmp_path / "qwen3_moe")
    config, unified_only = checkpoint_request(_spec(hf_dir, "engine", "fp8", "fp8", tp=2), hf_dir)
    assert unified_only is False
    assert config["architecture"] == "Qwen3MoeForCausalLM" and config["qwen_type"] == "qwen3_moe"
    assert config["moe"] == {"num_experts": 4, "top_k": 2, "normalization_mode": 0}
    assert (config["moe_intermediate_size"], config["moe_shared_expert_intermediate_size"]) == (128, 0)
    assert config["hidden_act"] == "swiglu" and config["dtype"] == "bfloat16"
    assert config["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert config["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}


@pytest.mark.parametrize(
    ("model_type", "target", "algo", "reason"),
    [
        ("qwen3_moe", "engine", "int4_awq", "fused MoE experts"),
        ("gpt_oss", "llmapi", "w4a8_awq", "gptossforcausallm not supported"),
        ("starcoder2", "engine", "int8_sq", "precision matrix lists only FP8"),
    ],
)
def test_checkpoint_request_refuses_what_the_family_table_refuses(model_type, target, algo, reason, tmp_path: Path) -> None:
    hf_dir = _config_only(model_type, tmp_path / model_type)
    with pytest.raises(StageError, match=rf"{model_type} in quantize.algo {algo} is refused on build.target {target}: .*{reason}"):
        checkpoint_request(_spec(hf_dir, target, algo), hf_dir)


@pytest.mark.parametrize(
    ("model_type", "algo", "reason"),
    [
        ("qwen3_moe", "int4_awq", "fused MoE experts"),
        ("mixtral", "int8_sq", "no INT8 SmoothQuant for MoE"),
        ("mixtral", "int8_wo", "weight-only formats on MoE experts"),
        ("starcoder2", "w4a8_awq", "precision matrix lists only FP8"),
    ],
)
def test_export_refuses_a_format_the_family_table_refuses_before_loading_weights(model_type, algo, reason, tmp_path: Path) -> None:
    from pipeline.quantization.modelopt_export import QuantRecipe, export_trtllm_checkpoint

    hf_dir = _config_only(model_type, tmp_path / model_type)
    with pytest.raises(StageError, match=rf"export: {model_type} in quantize.algo {algo} is refused .*{reason}"):
        export_trtllm_checkpoint(hf_dir, tmp_path / "out", dtype="float16", tp_size=1, pp_size=1, quant=QuantRecipe(algo), forward_loop=lambda model: None)
    assert not (tmp_path / "out").exists()

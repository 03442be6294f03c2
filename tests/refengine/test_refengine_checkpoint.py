"""Loading TensorRT-LLM checkpoints and CPU engine directories; clear errors for bad ones."""

from __future__ import annotations

import json

import pytest
import torch

from refengine import (
    EngineConfig,
    EngineConfigError,
    LLMEngine,
    ModelLoadError,
    SamplingParams,
    load_checkpoint,
    load_engine_dir,
    write_engine_dir,
)
from refengine.model_config import RopeScalingType
from refengine.model_runner import LlamaModel

BUILD_CONFIG = {
    "max_batch_size": 4,
    "max_input_len": 32,
    "max_seq_len": 64,
    "max_num_tokens": 96,
    "max_beam_width": 1,
    "kv_cache_type": "PAGED",
    "plugin_config": {"tokens_per_block": 16, "paged_kv_cache": True},
}


def test_checkpoint_config_is_parsed(small_checkpoint):
    checkpoint = load_checkpoint(small_checkpoint)
    config = checkpoint.config
    assert (config.num_heads, config.num_kv_heads, config.head_size) == (4, 2, 8)
    assert config.q_size == 32 and config.kv_size == 16
    assert config.rope_scaling.type is RopeScalingType.NONE
    assert checkpoint.tensors.has("lm_head.weight")


def test_llama3_rotary_scaling_accepts_type_or_rope_type(tmp_path, checkpoint_writer):
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    for key in ("type", "rope_type"):
        directory = checkpoint_writer(tmp_path / key, rotary_scaling={key: "llama3", **scaling})
        rope = load_checkpoint(directory).config.rope_scaling
        assert rope.type is RopeScalingType.LLAMA3 and rope.original_max_position_embeddings == 8192


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"architecture": "BloomForCausalLM"}, "architecture 'BloomForCausalLM' is not supported"),
        ({"architecture": "QWenForCausalLM", "qwen_type": "qwen"}, "qwen_type 'qwen'"),
        ({"dtype": "int8"}, "dtype 'int8'"),
        ({"mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}, "mapping.world_size is 2"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"position_embedding_type": "alibi"}, "position_embedding_type 'alibi'"),
        ({"rotary_scaling": {"type": "yarn", "factor": 2.0}}, "rotary_scaling type 'yarn'"),
        ({"rotary_scaling": {"type": "llama3", "factor": 8.0}}, "rotary_scaling.low_freq_factor"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads (3)"),
        ({"vocab_size": None}, "missing required field 'vocab_size'"),
        ({"hidden_size": "64"}, "'hidden_size' must be a positive integer"),
    ],
)
def test_unsupported_or_broken_config_is_refused(tmp_path, changes, message, checkpoint_writer):
    directory = checkpoint_writer(tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(directory)


def test_missing_tensor_is_named(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt")
    tensor_rewriter(directory, lambda t: t.pop("transformer.layers.1.mlp.gate.weight"))
    with pytest.raises(ModelLoadError, match=r"'transformer.layers.1.mlp.gate.weight' \(expected shape \(48, 32\)\) is missing"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


def test_misshaped_tensor_names_both_shapes(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt")
    tensor_rewriter(directory, lambda t: t.update({"transformer.layers.0.attention.qkv.weight": torch.zeros(40, 32, dtype=torch.float16)}))
    with pytest.raises(ModelLoadError, match=r"'transformer.layers.0.attention.qkv.weight' has shape \(40, 32\), expected \(64, 32\)"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


def test_qwen_needs_qkv_bias(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt", architecture="QWenForCausalLM")
    LlamaModel.from_checkpoint(load_checkpoint(directory))
    tensor_rewriter(directory, lambda t: t.pop("transformer.layers.0.attention.qkv.bias"))
    with pytest.raises(ModelLoadError, match="'transformer.layers.0.attention.qkv.bias'"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


def test_integer_weights_without_quantization_are_refused(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt")
    tensor_rewriter(directory, lambda t: t.update({"transformer.layers.0.mlp.proj.weight": torch.zeros(32, 48, dtype=torch.int8)}))
    with pytest.raises(ModelLoadError, match="has dtype torch.int8"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


@pytest.mark.parametrize("field", ["quant_algo", "kv_cache_quant_algo"])
def test_unsupported_quantization_is_refused(tmp_path, field, checkpoint_writer):
    directory = checkpoint_writer(tmp_path / "ckpt", quantization={field: "NVFP4"})
    with pytest.raises(ModelLoadError, match=f"quantization.{field} 'NVFP4' is not supported"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


def test_tied_embeddings_use_the_vocab_embedding(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt")
    tensor_rewriter(directory, lambda t: t.pop("lm_head.weight"))
    model = LlamaModel.from_checkpoint(load_checkpoint(directory))
    assert model.lm_head is model.embedding


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "config.json does not exist"),
        (lambda d: (d / "config.json").write_text("{not json"), "cannot parse"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "must hold a JSON object"),
        (lambda d: (d / "rank0.safetensors").unlink(), "rank0.safetensors does not exist"),
        (lambda d: (d / "rank0.safetensors").write_bytes(b"garbage"), "cannot read weights file"),
    ],
)
def test_broken_directories(tmp_path, setup, message, checkpoint_writer):
    directory = checkpoint_writer(tmp_path / "ckpt")
    setup(directory)
    with pytest.raises(ModelLoadError, match=message):
        load_checkpoint(directory)


def test_engine_dir_round_trip(small_checkpoint, tmp_path):
    engine_dir = write_engine_dir(small_checkpoint, tmp_path / "engine", BUILD_CONFIG, version="1.2.0")
    raw = json.loads((engine_dir / "config.json").read_text())
    assert set(raw) == {"version", "pretrained_config", "build_config"}
    loaded = load_engine_dir(engine_dir)
    assert loaded.version == "1.2.0"
    assert loaded.checkpoint.config == load_checkpoint(small_checkpoint).config

    engine = LLMEngine.from_engine_dir(engine_dir, enable_chunked_context=True)
    config = engine.config
    assert (config.max_batch_size, config.max_input_len, config.max_seq_len, config.max_num_tokens) == (4, 32, 64, 96)
    assert config.tokens_per_block == 16 and config.enable_chunked_context
    params = SamplingParams(max_tokens=6, temperature=0)
    reference = LLMEngine.from_checkpoint(small_checkpoint, EngineConfig(tokens_per_block=16))
    assert engine.generate([[1, 2, 3]], params)[0].outputs == reference.generate([[1, 2, 3]], params)[0].outputs


def test_checkpoint_dir_is_not_an_engine_dir(small_checkpoint):
    with pytest.raises(ModelLoadError, match="no 'pretrained_config' object"):
        load_engine_dir(small_checkpoint)


def test_build_config_max_beam_width_is_read():
    assert EngineConfig.from_build_config({**BUILD_CONFIG, "max_beam_width": 4}).max_beam_width == 4
    with pytest.raises(EngineConfigError, match="max_beam_width"):
        EngineConfig.from_build_config({**BUILD_CONFIG, "max_beam_width": 0})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_num_tokens": -5}, "max_num_tokens"),
        ({"tokens_per_block": 1.5}, "tokens_per_block"),
        ({"num_kv_blocks": 0}, "num_kv_blocks"),
        ({"max_input_len": 4096, "max_seq_len": 2048}, "max_input_len"),
        ({"scheduler_policy": "fastest"}, "scheduler_policy"),
        ({"compute_dtype": "float64"}, "compute_dtype"),
    ],
)
def test_engine_config_validation(changes, field):
    with pytest.raises(EngineConfigError, match=f"^{field}: ") as error:
        EngineConfig(**changes)
    assert error.value.field == field


def test_trtllm_policy_names_are_accepted():
    assert EngineConfig(scheduler_policy="MAX_UTILIZATION").scheduler_policy.value == "max_utilization"


@pytest.mark.parametrize("compute_dtype", ["float16", "bfloat16"])
def test_other_compute_dtypes_run(small_checkpoint, compute_dtype):
    engine = LLMEngine.from_checkpoint(small_checkpoint, EngineConfig(tokens_per_block=4, compute_dtype=compute_dtype))
    [output] = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0))
    assert len(output.outputs[0].token_ids) == 5

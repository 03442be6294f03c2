"""Tiny random Llama-family models, exported to TensorRT-LLM checkpoints with ModelOpt.

One session builds each model once; ModelOpt is imported once (it takes seconds). Every model
is created in float32, exported in float16, and the Hugging Face copy's parameters are
round-tripped through float16 so both sides use identical weights. (Not `model.half().float()`:
that also rounds the RoPE `inv_freq` buffer to fp16 and makes the reference itself inexact.)

ModelOpt 0.47 with transformers 5 does not write `rotary_base` / `rotary_scaling` (transformers
5 moved them into `rope_parameters`, which ModelOpt does not read), so `_add_rope_fields` writes
them with their documented TensorRT-LLM names. For tied embeddings ModelOpt still writes a copy
of the table as `lm_head.weight`; the fixture removes it to exercise the tied path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

VOCAB_SIZE = 256

# name -> (HF family, config overrides)
MODEL_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_gqa": ("llama", {"num_attention_heads": 8, "num_key_value_heads": 2}),
    "llama_mqa": ("llama", {"num_attention_heads": 8, "num_key_value_heads": 1}),
    "mistral": ("mistral", {"num_attention_heads": 8, "num_key_value_heads": 2}),
    "qwen2_bias": ("qwen2", {"num_attention_heads": 4, "num_key_value_heads": 2}),
    "llama_tied": ("llama", {"num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama3_rope": (
        "llama",
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama3_rope_mqa": (
        "llama",
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 32.0,
                "low_freq_factor": 2.0,
                "high_freq_factor": 8.0,
                "original_max_position_embeddings": 128,
            },
        },
    ),
    "llama_linear_rope": (
        "llama",
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        },
    ),
}


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """Tiny matmuls are ~1000x slower with a 2-thread pool on shared cores; restore afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def quantized_suite(tmp_path_factory: pytest.TempPathFactory):
    """Every ModelOpt export format of one tiny random Llama (quant_fixtures.build_quantized_suite)."""
    from tests.support.quant_fixtures import build_quantized_suite

    return build_quantized_suite(tmp_path_factory)


@dataclass(frozen=True)
class TinyModel:
    name: str
    checkpoint_dir: Path
    hf_model: Any  # transformers model, float32, eval mode, EOS disabled


def _hf_model(family: str, overrides: dict[str, Any], seed: int) -> Any:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    config_class, model_class = classes[family]
    settings = dict(
        architectures=[model_class.__name__],  # as in a real checkpoint; ModelOpt copies it
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        max_position_embeddings=256,
        initializer_range=0.08,
        rms_norm_eps=1e-6,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    config = config_class(**settings)
    # Eager attention: the engine reproduces it bit for bit. (SDPA differs by ~1e-6, which can
    # flip a near-tie in these random models: both are valid float32 results.)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a mapping mistake shows
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.add_(0.2 * torch.randn_like(parameter))
            elif name.endswith(".bias"):
                parameter.copy_(0.3 * torch.randn_like(parameter))
    return model


def _add_rope_fields(config_path: Path, hf_config: Any) -> None:
    config = json.loads(config_path.read_text())
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    config["rotary_base"] = float(rope.pop("rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", "default")
    if rope_type != "default":
        config["rotary_scaling"] = {"type": rope_type, **rope}
    config_path.write_text(json.dumps(config, indent=2))


def _drop_lm_head(checkpoint_dir: Path) -> None:
    weights_path = checkpoint_dir / "rank0.safetensors"
    tensors = load_file(str(weights_path))
    tensors.pop("lm_head.weight", None)
    save_file(tensors, str(weights_path))
    config_path = checkpoint_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["share_embedding_table"] = True
    config_path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    """`tiny_model(name)` -> a TinyModel from MODEL_SPECS, built once per session."""
    built: dict[str, TinyModel] = {}

    def build(name: str) -> TinyModel:
        if name in built:
            return built[name]
        from modelopt.torch.export import export_tensorrt_llm_checkpoint

        family, overrides = MODEL_SPECS[name]
        model = _hf_model(family, overrides, seed=sorted(MODEL_SPECS).index(name))
        directory = tmp_path_factory.mktemp(f"ckpt_{name}")
        decoder_type = "qwen" if family == "qwen2" else "llama"
        export_tensorrt_llm_checkpoint(
            model,
            decoder_type,
            dtype=torch.float16,
            export_dir=directory,
            inference_tensor_parallel=1,
            inference_pipeline_parallel=1,
        )
        _add_rope_fields(directory / "config.json", model.config)
        if overrides.get("tie_word_embeddings"):
            _drop_lm_head(directory)
        with torch.no_grad():  # the exported fp16 weights, back in fp32 (buffers such as
            for parameter in model.parameters():  # RoPE's inv_freq must stay fp32: no .half())
                parameter.copy_(parameter.half().float())
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        built[name] = TinyModel(name, directory, model)
        return built[name]

    return build


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> tuple[int, ...]:
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
    return tuple(generated[0, len(prompt) :].tolist())


@pytest.fixture(scope="session")
def hf_greedy_fn() -> Callable[[Any, list[int], int], tuple[int, ...]]:
    return hf_greedy


def write_random_checkpoint(directory: Path, seed: int = 0, **config_changes: Any) -> Path:
    """A TensorRT-LLM checkpoint written by hand with the documented names (no ModelOpt).

    `config_changes` override config.json fields; tensors follow the resulting config.
    """
    config: dict[str, Any] = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "logits_dtype": "float32",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "hidden_act": "silu",
        "norm_epsilon": 1e-5,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": 128,
        "rotary_base": 10000.0,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    config.update(config_changes)
    generator = torch.Generator().manual_seed(seed)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head = hidden // config["num_attention_heads"]
    qkv_out = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head

    def random(*shape: int) -> torch.Tensor:
        return (0.1 * torch.randn(*shape, generator=generator)).to(torch.float16)

    tensors = {
        "transformer.vocab_embedding.weight": random(config["vocab_size"], hidden),
        "transformer.ln_f.weight": torch.ones(hidden, dtype=torch.float16),
        "lm_head.weight": random(config["vocab_size"], hidden),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"transformer.layers.{layer}."
        tensors[prefix + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.float16)
        tensors[prefix + "post_layernorm.weight"] = torch.ones(hidden, dtype=torch.float16)
        tensors[prefix + "attention.qkv.weight"] = random(qkv_out, hidden)
        tensors[prefix + "attention.dense.weight"] = random(hidden, hidden)
        tensors[prefix + "mlp.fc.weight"] = random(inner, hidden)
        tensors[prefix + "mlp.gate.weight"] = random(inner, hidden)
        tensors[prefix + "mlp.proj.weight"] = random(hidden, inner)
        if config["architecture"] in ("QWenForCausalLM", "Qwen2ForCausalLM"):
            tensors[prefix + "attention.qkv.bias"] = random(qkv_out)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(directory / "rank0.safetensors"))
    return directory


def rewrite_tensors(directory: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = directory / "rank0.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("small_ckpt"))


# Helpers as fixtures: test modules never `import conftest` (ambiguous next to other test
# directories' conftest.py files).
@pytest.fixture(scope="session")
def checkpoint_writer() -> Callable[..., Path]:
    return write_random_checkpoint


@pytest.fixture(scope="session")
def tensor_rewriter() -> Callable[[Path, Callable[[dict[str, torch.Tensor]], None]], None]:
    return rewrite_tensors


@pytest.fixture(params=sorted(MODEL_SPECS))
def any_model_name(request: pytest.FixtureRequest) -> str:
    """Each MODEL_SPECS entry in turn."""
    return request.param

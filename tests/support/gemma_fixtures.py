"""Tiny random Gemma, Gemma 2 and Gemma 3 (text) models, exported to TensorRT-LLM checkpoints by the project's converter.

As family_fixtures.py: transformers' own class (float32, eager attention), saved as safetensors, exported with
`pipeline.quantization.modelopt_export.export_trtllm_checkpoint` in float16; the reference is the saved model with
its parameters round-tripped through float16. Gemma's norms are stored as 1 + w (the converter adds the one), so
the random norm weights lie on a 1/256 grid: w and 1 + w are then both exact in float16 and the checkpoint's
1 + w is exactly transformers' float32 `1.0 + w`.

The local layers' window is 16 tokens, so prompts and generations of tens of tokens cross it. The embedding table
is scaled down (Gemma multiplies it by √hidden, and a tied table that dominates the residual makes a random model
repeat its input token) so that the greedy outputs vary.

Gemma 2's checkpoint has no `sliding_window` key (TensorRT-LLM's Gemma 2 has none; the converter writes none):
`gemma2` is that checkpoint, `gemma2_windowed` the same with `sliding_window` added, which refengine honours.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 256
WINDOW = 16
_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# name -> (model_type, config overrides); head_dim 32 while hidden / heads is 16
GEMMA_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma": ("gemma", {"num_hidden_layers": 2}),
    # soft caps small enough that tanh bends the tiny model's scores and logits
    "gemma2": ("gemma2", {"sliding_window": WINDOW, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 1.5, "final_logit_softcapping": 2.5}),
    # layers 0, 1, 3 local (pattern 3); the global layers' RoPE with Gemma 3 4B's linear scaling
    "gemma3_text": (
        "gemma3_text",
        {
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "final_logit_softcapping": 2.5,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        },
    ),
}


@dataclass
class GemmaModel:
    name: str
    checkpoint_dir: Path
    hf_model: Any  # transformers, float32 with the checkpoint's fp16 values, EOS disabled


def build_gemma_model(name: str, root: Path) -> GemmaModel:
    """The GEMMA_SPECS model `name` (seeded by its place there), exported into `root / name`."""
    from pipeline.quantization.modelopt_export import export_trtllm_checkpoint

    model_type, overrides = GEMMA_SPECS[name]
    hf_model = _hf_model(model_type, overrides, list(GEMMA_SPECS).index(name))
    hf_dir = root / name / "hf"
    hf_model.save_pretrained(hf_dir)
    export_trtllm_checkpoint(hf_dir, root / name / "ckpt", dtype="float16", tp_size=1, pp_size=1)
    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    return GemmaModel(name, root / name / "ckpt", hf_model)


def build_gemma_models(root: Path) -> dict[str, GemmaModel]:
    """Every GEMMA_SPECS model, plus `gemma2_windowed` (Gemma 2's checkpoint with its sliding_window)."""
    built = {name: build_gemma_model(name, root) for name in GEMMA_SPECS}
    windowed = root / "gemma2_windowed"
    shutil.copytree(built["gemma2"].checkpoint_dir, windowed)
    config = json.loads((windowed / "config.json").read_text())
    config["sliding_window"] = WINDOW
    (windowed / "config.json").write_text(json.dumps(config, indent=2))
    built["gemma2_windowed"] = GemmaModel("gemma2_windowed", windowed, built["gemma2"].hf_model)
    return built


def _hf_model(model_type: str, overrides: dict[str, Any], seed: int) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**_COMMON, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config.architectures = [type(model).__name__]
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):  # non-trivial, on the 1/256 grid (see the module docstring)
                parameter.copy_(torch.round(0.3 * torch.randn_like(parameter) * 256) / 256)
            elif "embed_tokens" in name:
                parameter.mul_(0.1)
            parameter.copy_(parameter.half().float())
    return model

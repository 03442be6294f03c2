"""Tiny random checkpoints of every model family, made as a user would: transformers' `AutoConfig.for_model`,
`AutoModelForCausalLM.from_config`, `save_pretrained` (safetensors), with the default model's tokenizer.

Every linear dimension is a multiple of 128 (so AWQ's group size divides it) and the vocabulary is the default
tokenizer's 4096 tokens. `head_dim` differs from hidden ÷ heads where the family allows it (Qwen3, Gemma), so
the head-size arithmetic is exercised.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.conftest import DEFAULT_MODEL

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 128}

# model_type -> config overrides beyond _COMMON
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2": {},
    "qwen2_moe": {**_MOE, "num_experts": 4, "shared_expert_intermediate_size": 128},
    "qwen3": {"head_dim": 64},
    "qwen3_moe": {**_MOE, "num_experts": 4, "head_dim": 64},
    "gemma": {"head_dim": 32},
    "gemma2": {"head_dim": 64, "sliding_window": 1024, "query_pre_attn_scalar": 64},
    "gemma3_text": {
        "head_dim": 64,
        "sliding_window": 512,
        "query_pre_attn_scalar": 64,
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    },
    "phi3": {},
    "granite": {},
    "starcoder2": {"intermediate_size": 512},
    "nemotron": {"intermediate_size": 512, "partial_rotary_factor": 0.5},
    "deepseek_v3": {
        **_MOE,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "kv_lora_rank": 128,
        "q_lora_rank": None,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "num_key_value_heads": 4,
    },
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "head_dim": 32,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "llama4_text": {
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 256,
        "head_dim": 32,
        "interleave_moe_layer_step": 1,
        "no_rope_layers": [1, 1],
    },
    "olmo2": {},
}


def make_family_checkpoint(model_type: str, directory: Path, **overrides: Any) -> Path:
    """Save a tiny random `model_type` checkpoint into `directory` (created); return it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = AutoConfig.for_model(model_type, **{**_COMMON, **FAMILY_CONFIGS[model_type], **overrides})
    torch.manual_seed(sorted(FAMILY_CONFIGS).index(model_type))  # a seed per family: Llama and Mistral differ too
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.config.architectures = [type(model).__name__]
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        shutil.copy2(DEFAULT_MODEL / name, directory / name)
    return directory

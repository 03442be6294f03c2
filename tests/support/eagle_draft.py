"""A random EAGLE-1/2 draft checkpoint in SafeAILab EAGLE's layout (what the yuhuili/EAGLE-* checkpoints hold and
TensorRT-LLM's examples/eagle/convert_checkpoint.py reads): config.json (a LlamaConfig) and model.safetensors with
fc.weight/bias, embed_tokens.weight and layers.{l}.* (no input_layernorm in layer 0), float16."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def write_eagle_draft(
    directory: Path,
    *,
    hidden: int = 256,
    vocab: int = 4096,
    heads: int = 4,
    kv_heads: int = 2,
    inter: int = 512,
    layers: int = 1,
    seed: int = 0,
    drop: tuple[str, ...] = (),
    **config_overrides,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def tensor(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16)

    tensors = {"fc.weight": tensor(hidden, 2 * hidden), "fc.bias": tensor(hidden), "embed_tokens.weight": tensor(vocab, hidden)}
    for layer in range(layers):
        p = f"layers.{layer}"
        tensors.update(
            {
                f"{p}.self_attn.q_proj.weight": tensor(heads * head_dim, hidden),
                f"{p}.self_attn.k_proj.weight": tensor(kv_heads * head_dim, hidden),
                f"{p}.self_attn.v_proj.weight": tensor(kv_heads * head_dim, hidden),
                f"{p}.self_attn.o_proj.weight": tensor(hidden, heads * head_dim),
                f"{p}.mlp.gate_proj.weight": tensor(inter, hidden),
                f"{p}.mlp.up_proj.weight": tensor(inter, hidden),
                f"{p}.mlp.down_proj.weight": tensor(hidden, inter),
                f"{p}.post_attention_layernorm.weight": tensor(hidden),
            }
        )
        if layer > 0:
            tensors[f"{p}.input_layernorm.weight"] = tensor(hidden)
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(directory / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "vocab_size": vocab,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1024,
        "bias": True,
    }
    (directory / "config.json").write_text(json.dumps({**config, **config_overrides}))
    return directory

"""Random Medusa heads in the contract's layout (FasterDecoding Medusa's, read by TensorRT-LLM's Medusa conversion):
medusa_lm_head.safetensors with {h}.{l}.linear.weight/bias and {h}.{L}.weight, float16, and config.json beside it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

DEFAULT_CHOICES = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0]]


def write_medusa_heads(
    directory: Path,
    *,
    num_heads: int = 3,
    num_layers: int = 1,
    hidden: int = 256,
    vocab: int = 4096,
    choices: list[list[int]] | None = DEFAULT_CHOICES,
    seed: int = 0,
    **config_overrides,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            tensors[f"{h}.{layer}.linear.weight"] = rng.standard_normal((hidden, hidden)).astype(np.float16)
            tensors[f"{h}.{layer}.linear.bias"] = rng.standard_normal((hidden,)).astype(np.float16)
        tensors[f"{h}.{num_layers}.weight"] = rng.standard_normal((vocab, hidden)).astype(np.float16)
    save_file(tensors, str(directory / "medusa_lm_head.safetensors"))
    config = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "hidden_size": hidden,
        "vocab_size": vocab,
        "medusa_hidden_act": "silu",
        "base_model_name_or_path": "tiny-stdlib-llama",
    }
    if choices is not None:
        config["medusa_choices"] = choices
    config.update(config_overrides)
    (directory / "config.json").write_text(json.dumps(config))
    return directory

"""Facts about a local Hugging Face checkpoint directory, read from its files without loading weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# TensorRT-LLM does not multiply max_position_embeddings by the factor for these RoPE types.
_ROPE_TYPES_WITHOUT_LENGTH_SCALING = ("llama3", "su", "longrope")


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    model_type: str
    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None
    weight_files: tuple[str, ...]
    pickle_files: tuple[str, ...]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def default_max_seq_len(self) -> int:
        """What trtllm-build deduces when --max_seq_len is not given (trtllm.md §1.2)."""
        length = self.max_position_embeddings
        scaling = self.rope_scaling or {}
        rope_type = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if factor and rope_type not in _ROPE_TYPES_WITHOUT_LENGTH_SCALING:
            length = int(length * float(factor))
        return length


def read_model_info(path: Path) -> ModelInfo:
    """Read `path/config.json` and list the weight files. Raises FileNotFoundError / ValueError / KeyError."""
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    files = sorted(p.name for p in path.iterdir() if p.is_file())
    return ModelInfo(
        path=path,
        model_type=str(config.get("model_type", "")),
        architecture=(config.get("architectures") or ["?"])[0],
        num_layers=int(text["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text.get("intermediate_size") or 0),
        vocab_size=int(text["vocab_size"]),
        max_position_embeddings=int(text.get("max_position_embeddings") or 2048),
        # transformers 5 writes rope_parameters where 4.x wrote rope_scaling
        rope_scaling=text.get("rope_scaling") or text.get("rope_parameters"),
        weight_files=tuple(f for f in files if f.endswith(".safetensors")),
        pickle_files=tuple(f for f in files if f.endswith(PICKLE_SUFFIXES)),
    )

"""Facts about a local Hugging Face checkpoint directory, read from its files without loading weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


class ModelConfigError(ValueError):
    """A config.json field the pipeline reads is missing, of the wrong type or out of range."""


# Bounds of what a real decoder-only checkpoint has (the largest vocabularies are ~260k tokens).
_LIMITS = {
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "hidden_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 22),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24),
}


def _integer(config: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ModelConfigError(f"{where}: {key} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{where}: {key} must be an integer, got {value!r:.40}")
    low, high = _LIMITS[key]
    if not low <= value <= high:
        raise ModelConfigError(f"{where}: {key} {value} is out of range ({low}..{high})")
    return value


def read_model_info(path: Path) -> ModelInfo:
    """Read `path/config.json` and list the weight files. Raises OSError, ValueError (bad JSON) or
    ModelConfigError naming the field that is missing, mistyped or out of range."""
    where = str(path / "config.json")
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ModelConfigError(f"{where}: not a JSON object")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise ModelConfigError(f"{where}: text_config is not an object")
    heads = _integer(text, "num_attention_heads", where)
    kv_heads = _integer(text, "num_key_value_heads", where, default=heads)
    hidden = _integer(text, "hidden_size", where)
    if heads % kv_heads:
        raise ModelConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if text.get("head_dim") is None and hidden % heads:
        raise ModelConfigError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no head_dim is given)")
    architectures = config.get("architectures") or ["?"]
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        raise ModelConfigError(f"{where}: architectures must be a list of class names, got {architectures!r:.60}")
    files = sorted(p.name for p in path.iterdir() if p.is_file())
    return ModelInfo(
        path=path,
        model_type=str(config.get("model_type", "")),
        architecture=architectures[0],
        num_layers=_integer(text, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        hidden_size=hidden,
        intermediate_size=_integer(text, "intermediate_size", where) if text.get("intermediate_size") is not None else 0,
        vocab_size=_integer(text, "vocab_size", where),
        max_position_embeddings=_integer(text, "max_position_embeddings", where, default=2048),
        # transformers 5 writes rope_parameters where 4.x wrote rope_scaling
        rope_scaling=text.get("rope_scaling") or text.get("rope_parameters"),
        weight_files=tuple(f for f in files if f.endswith(".safetensors")),
        pickle_files=tuple(f for f in files if f.endswith(PICKLE_SUFFIXES)),
    )

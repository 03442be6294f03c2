"""Facts about a local Hugging Face checkpoint directory, read from its files without loading weights."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    head_size: int | None = None  # config.json head_dim (Qwen3, Gemma: not hidden ÷ heads); None: hidden ÷ heads
    # Per decoder layer, its attention window in tokens (None: the whole sequence), from layer_types /
    # sliding_window / sliding_window_pattern; empty when every layer attends to the whole sequence.
    layer_windows: tuple[int | None, ...] = ()
    moe: MoeInfo | None = None
    mla: MlaInfo | None = None
    tie_word_embeddings: bool = False
    has_architectures: bool = True  # config.json names its model class (`architectures`)
    text_config: Mapping[str, Any] = field(default_factory=dict)  # the language model's part of config.json

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.hidden_size // self.num_heads

    @property
    def sliding_layers(self) -> int:
        return sum(window is not None for window in self.layer_windows)

    def default_max_seq_len(self) -> int:
        """What trtllm-build deduces when --max_seq_len is not given (tensorrt_llm/commands/build.py)."""
        length = self.max_position_embeddings
        scaling = self.rope_scaling or {}
        rope_type = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if factor and rope_type not in _ROPE_TYPES_WITHOUT_LENGTH_SCALING:
            length = int(length * float(factor))
        return length


@dataclass(frozen=True)
class MoeInfo:
    """A mixture-of-experts model's routed experts (every MoE layer alike)."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    dense_layers: int = 0  # leading layers with a dense MLP instead (DeepSeek's first_k_dense_replace)
    source_key: str = "num_experts"  # the config.json key the expert count came from


@dataclass(frozen=True)
class MlaInfo:
    """Multi-head latent attention (DeepSeek V2/V3): one compressed KV head per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def cached_width(self) -> int:
        """What one layer caches per token: the latent plus the shared RoPE key, stored once (kvFactor 1)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


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
    "head_dim": (1, 4096),
    "sliding_window": (1, 1 << 24),
    "sliding_window_pattern": (1, 1024),
    "num_experts": (1, 4096),
    "num_local_experts": (1, 4096),
    "n_routed_experts": (1, 4096),
    "num_experts_per_tok": (1, 4096),
    "moe_intermediate_size": (1, 1 << 22),
    "shared_expert_intermediate_size": (0, 1 << 22),
    "n_shared_experts": (0, 256),
    "first_k_dense_replace": (0, 1024),
    "kv_lora_rank": (1, 1 << 16),
    "qk_rope_head_dim": (1, 4096),
}
# transformers' config classes that tie the output projection to the embeddings when config.json does not say
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
# The config.json keys that count a model's routed experts, by family (the first present is read).
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


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
    layers = _integer(text, "num_hidden_layers", where)
    max_positions = _integer(text, "max_position_embeddings", where, default=2048)
    return ModelInfo(
        path=path,
        model_type=str(config.get("model_type", "")),
        architecture=architectures[0],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        hidden_size=hidden,
        intermediate_size=_integer(text, "intermediate_size", where) if text.get("intermediate_size") is not None else 0,
        vocab_size=_integer(text, "vocab_size", where),
        max_position_embeddings=max_positions,
        # transformers 5 writes rope_parameters where 4.x wrote rope_scaling
        rope_scaling=text.get("rope_scaling") or text.get("rope_parameters"),
        weight_files=tuple(f for f in files if f.endswith(".safetensors")),
        pickle_files=tuple(f for f in files if f.endswith(PICKLE_SUFFIXES)),
        head_size=_integer(text, "head_dim", where) if text.get("head_dim") is not None else None,
        layer_windows=_layer_windows(text, layers, where),
        moe=_moe_info(text, where),
        mla=_mla_info(text, where),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", _tied_by_default(config)))),
        has_architectures=bool(config.get("architectures")),
        text_config=text,
    )


def _tied_by_default(config: dict[str, Any]) -> bool:
    return config.get("model_type") in _TIED_BY_DEFAULT


def _layer_windows(text: dict[str, Any], layers: int, where: str) -> tuple[int | None, ...]:
    """Each layer's attention window (None: full), as transformers builds the model from this config.

    transformers 5 lists `layer_types` ("sliding_attention" / "full_attention"); older Gemma 3 configs give
    `sliding_window_pattern` (every N-th layer global), older Gemma 2 configs alternate (even layers sliding).
    A `sliding_window` alone (Mistral v0.1) windows every layer unless `use_sliding_window` is false (Qwen2/3).
    """
    if text.get("sliding_window") is None or text.get("use_sliding_window") is False:
        return ()
    window = _integer(text, "sliding_window", where)
    layer_types = text.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            raise ModelConfigError(f"{where}: layer_types must list one attention type per layer ({layers}), got {layer_types!r:.60}")
        unknown = sorted({t for t in layer_types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            raise ModelConfigError(f"{where}: layer_types has {', '.join(map(repr, unknown))}; known: 'sliding_attention', 'full_attention'")
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    elif text.get("sliding_window_pattern") is not None:
        pattern = _integer(text, "sliding_window_pattern", where)
        windows = tuple(None if (i + 1) % pattern == 0 else window for i in range(layers))
    elif str(text.get("model_type", "")).startswith("gemma2"):
        windows = tuple(window if i % 2 == 0 else None for i in range(layers))
    else:
        windows = (window,) * layers
    return windows if any(w is not None for w in windows) else ()


def _moe_info(text: dict[str, Any], where: str) -> MoeInfo | None:
    key = next((k for k in _EXPERT_COUNT_KEYS if text.get(k)), None)
    if key is None:
        return None
    experts = _integer(text, key, where)
    per_token = _integer(text, "num_experts_per_tok", where)
    if per_token > experts:
        raise ModelConfigError(f"{where}: num_experts_per_tok {per_token} is more than the {experts} experts ({key})")
    inter_key = "moe_intermediate_size" if text.get("moe_intermediate_size") is not None else "intermediate_size"
    expert_size = _integer(text, inter_key, where)
    shared = 0
    if text.get("shared_expert_intermediate_size"):
        shared = _integer(text, "shared_expert_intermediate_size", where)
    elif text.get("n_shared_experts"):
        shared = _integer(text, "n_shared_experts", where) * expert_size
    dense = _integer(text, "first_k_dense_replace", where) if text.get("first_k_dense_replace") else 0
    return MoeInfo(experts, per_token, expert_size, shared, dense, key)


def _mla_info(text: dict[str, Any], where: str) -> MlaInfo | None:
    if text.get("kv_lora_rank") is None:
        return None
    return MlaInfo(_integer(text, "kv_lora_rank", where), _integer(text, "qk_rope_head_dim", where))

"""The decoder's shape and options, parsed from a TensorRT-LLM `config.json` (PretrainedConfig).

Only the architectures of `refengine.architectures` run here; their rows check the family's own
options. Anything else is refused with a `ModelLoadError` that names the field. Keys and defaults
follow TensorRT-LLM's checkpoint format (PretrainedConfig in NVIDIA/TensorRT-LLM tensorrt_llm/models/modeling_utils.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from refengine.architectures import architecture_for_checkpoint
from refengine.errors import ModelLoadError

SUPPORTED_DTYPES = frozenset({"float16", "bfloat16", "float32"})


class RopeScalingType(str, enum.Enum):
    NONE = "none"
    LINEAR = "linear"
    LLAMA3 = "llama3"


@dataclass(frozen=True)
class RopeScaling:
    """`rotary_scaling` of the checkpoint; `type` or `rope_type` selects the method."""

    type: RopeScalingType = RopeScalingType.NONE
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_config(cls, raw: Mapping[str, Any] | None) -> RopeScaling:
        if not raw:
            return cls()
        name = raw.get("type", raw.get("rope_type"))
        if name in (None, "default", "none"):
            return cls()
        try:
            scaling_type = RopeScalingType(name)
        except ValueError:
            supported = ", ".join(t.value for t in RopeScalingType)
            raise ModelLoadError(f"rotary_scaling type {name!r} is not supported (supported: {supported})") from None
        factor = _positive_float(raw, "factor", "rotary_scaling.factor")
        if scaling_type is RopeScalingType.LINEAR:
            return cls(type=scaling_type, factor=factor)
        low = _positive_float(raw, "low_freq_factor", "rotary_scaling.low_freq_factor")
        high = _positive_float(raw, "high_freq_factor", "rotary_scaling.high_freq_factor")
        if high <= low:
            raise ModelLoadError(f"rotary_scaling.high_freq_factor ({high}) must exceed low_freq_factor ({low})")
        original = raw.get("original_max_position_embeddings")
        if not isinstance(original, int) or original <= 0:
            raise ModelLoadError(f"rotary_scaling.original_max_position_embeddings must be a positive integer, got {original!r}")
        return cls(scaling_type, factor, low, high, original)


@dataclass(frozen=True)
class QuantizationConfig:
    """The checkpoint's `quantization` block (TensorRT-LLM's QuantConfig: quant_algo, kv_cache_quant_algo, group_size 128, ...).

    Whether an algo can run is decided by the model runner (`quantized_linear`, `kv_quant`), which
    refuses unknown ones naming the supported set; here only the field types are checked.
    """

    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int = 128  # TensorRT-LLM's code default (NVIDIA/TensorRT-LLM docs/source/architecture/checkpoint.md says 64: stale)
    has_zero_point: bool = False
    pre_quant_scale: bool = False
    exclude_modules: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, raw: Any) -> QuantizationConfig:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ModelLoadError(f"quantization must be a JSON object, got {type(raw).__name__}")
        algos = {}
        for key in ("quant_algo", "kv_cache_quant_algo"):
            value = raw.get(key)
            if value is not None and not isinstance(value, str):
                raise ModelLoadError(f"quantization.{key} must be a string or null, got {value!r}")
            algos[key] = value
        group_size = _positive_int(raw, "group_size", default=128)
        exclude = raw.get("exclude_modules") or []
        if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
            raise ModelLoadError(f"quantization.exclude_modules must be a list of strings, got {exclude!r}")
        return cls(
            quant_algo=algos["quant_algo"],
            kv_cache_quant_algo=algos["kv_cache_quant_algo"],
            group_size=group_size,
            has_zero_point=bool(raw.get("has_zero_point", False)),
            pre_quant_scale=bool(raw.get("pre_quant_scale", False)),
            exclude_modules=tuple(exclude),
        )


@dataclass(frozen=True)
class ModelConfig:
    """What the model runner needs to know about the decoder."""

    architecture: str
    dtype: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    norm_epsilon: float
    rotary_base: float
    rope_scaling: RopeScaling
    max_position_embeddings: int | None
    qkv_bias_required: bool
    dense_bias_required: bool
    mlp_bias_required: bool
    quantization: QuantizationConfig

    @property
    def quant_algo(self) -> str | None:
        return self.quantization.quant_algo

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return self.quantization.kv_cache_quant_algo

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size

    @classmethod
    def from_pretrained_config(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Parse and check a TensorRT-LLM `config.json` (the checkpoint's, or `pretrained_config`)."""
        if not isinstance(raw, Mapping):
            raise ModelLoadError(f"checkpoint config must be a JSON object, got {type(raw).__name__}")
        architecture = _required(raw, "architecture")
        family = architecture_for_checkpoint(architecture)
        family.check_variant(raw)
        dtype = _required(raw, "dtype")
        if dtype not in SUPPORTED_DTYPES:
            raise ModelLoadError(f"dtype {dtype!r} is not supported (supported: float16, bfloat16, float32)")
        _check_world_size(raw)
        family.check_options(raw)
        quantization = QuantizationConfig.from_config(raw.get("quantization"))
        hidden_size = _positive_int(raw, "hidden_size")
        num_heads = _positive_int(raw, "num_attention_heads")
        num_kv_heads = _positive_int(raw, "num_key_value_heads", default=num_heads)
        if num_heads % num_kv_heads:
            raise ModelLoadError(f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})")
        if raw.get("head_size") is None and hidden_size % num_heads:
            raise ModelLoadError(f"hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_heads}); set head_size")
        head_size = _positive_int(raw, "head_size", default=hidden_size // num_heads)
        if head_size % 2:
            raise ModelLoadError(f"head_size ({head_size}) must be even for rotary embeddings")
        attn_bias = bool(raw.get("attn_bias", False))
        every_bias = bool(family.bias_key and raw.get(family.bias_key, False))  # GPT's `bias`: every decoder Linear
        return cls(
            architecture=architecture,
            dtype=dtype,
            vocab_size=_positive_int(raw, "vocab_size"),
            hidden_size=hidden_size,
            num_layers=_positive_int(raw, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            intermediate_size=_positive_int(raw, "intermediate_size"),
            norm_epsilon=float(raw.get("norm_epsilon", 1e-5)),
            rotary_base=float(raw.get("rotary_base", 10000.0)),
            # long_rope's rotary_scaling repeats the short/long factors the model reads from their own keys
            rope_scaling=RopeScaling() if raw.get("position_embedding_type") == "long_rope" else RopeScaling.from_config(raw.get("rotary_scaling")),
            max_position_embeddings=raw.get("max_position_embeddings"),
            qkv_bias_required=family.qkv_bias or attn_bias or every_bias,
            # TensorRT-LLM's QWen class reads attn_bias as the q/k/v bias only (its dense has none): optional there
            dense_bias_required=(attn_bias and family.checkpoint_decoder != "qwen") or every_bias,
            mlp_bias_required=bool(raw.get("mlp_bias", False)) or every_bias,
            quantization=quantization,
        )


def _check_world_size(raw: Mapping[str, Any]) -> None:
    mapping = raw.get("mapping") or {}
    world_size = mapping.get("world_size", 1)
    if world_size != 1:
        raise ModelLoadError(f"mapping.world_size is {world_size}; the reference engine runs world_size 1 only")


def _required(raw: Mapping[str, Any], key: str) -> Any:
    if key not in raw or raw[key] is None:
        raise ModelLoadError(f"checkpoint config is missing required field {key!r}")
    return raw[key]


def _positive_int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        value = default
    if value is None:
        raise ModelLoadError(f"checkpoint config is missing required field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"checkpoint config field {key!r} must be a positive integer, got {value!r}")
    return value


def _positive_float(raw: Mapping[str, Any], key: str, label: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ModelLoadError(f"{label} must be a positive number, got {value!r}")
    return float(value)

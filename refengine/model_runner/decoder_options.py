"""The family options of the Llama decoder, read from a TensorRT-LLM checkpoint's config.json.

Each is a small difference from Llama that a row of `refengine.architectures` allows (its options check refuses
the rest, by name): Qwen3's per-head q/k RMSNorm (`qk_layernorm`), Phi-3's partial rotary (`rotary_pct`) and
long-RoPE (`position_embedding_type: long_rope`), Granite's multipliers, a mixture of experts as the MLP (`moe`),
the GPT class's LayerNorm and the plain (ungated) MLP of the GPT and Phi-3 classes. With none of them set, `LlamaModel` runs exactly
the Llama computation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from refengine.architectures import architecture_for_checkpoint
from refengine.errors import ModelLoadError
from refengine.model_config import ModelConfig
from refengine.model_runner.layers import LongRope
from refengine.model_runner.moe import MoeSpec


@dataclass(frozen=True)
class DecoderOptions:
    rotary_dim: int  # features of each head that RoPE rotates (head_size unless rotary_pct < 1)
    attention_scale: float  # softmax scale of q·k
    qk_layernorm: bool = False  # RMSNorm over each q / k head (attention.q_layernorm / k_layernorm) before RoPE
    embedding_multiplier: float = 1.0  # Granite: the embedding output is multiplied by it
    residual_multiplier: float = 1.0  # Granite: each block's output, before it is added to the residual
    output_multiplier_scale: float = 1.0  # Granite: 1 / logits_scaling, multiplies the logits
    long_rope: LongRope | None = None  # Phi-3 128k: short / long factors
    layer_norm: bool = False  # GPT class: LayerNorm (with the checkpoint's biases) instead of RMSNorm, every norm
    ungated_activation: str | None = None  # GPT, Phi-3: the plain MLP proj(act(fc(x))), act a key of UNGATED_ACTIVATIONS
    moe: MoeSpec | None = None  # Mixtral / Qwen MoE: every layer's MLP is a mixture of experts (moe.py)

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], config: ModelConfig) -> DecoderOptions:
        head_size = config.head_size
        rotary_dim = int(head_size * float(raw.get("rotary_pct", 1.0)))
        if rotary_dim < 2 or rotary_dim % 2:
            raise ModelLoadError(
                f"rotary_pct {raw.get('rotary_pct')} gives rotary dimension {rotary_dim} of head_size {head_size}; it must be even and at least 2"
            )
        attention_multiplier = raw.get("attention_multiplier")
        # TensorRT-LLM: q_scaling = 1 / attention_multiplier, scale = 1 / (sqrt(head_size) * q_scaling)
        scale = head_size**-0.5 if attention_multiplier in (None, 1.0) else attention_multiplier / math.sqrt(head_size)
        return cls(
            rotary_dim=rotary_dim,
            attention_scale=scale,
            qk_layernorm=bool(raw.get("qk_layernorm", False)),
            embedding_multiplier=float(raw.get("embedding_multiplier") or 1.0),
            residual_multiplier=float(raw.get("residual_multiplier") or 1.0),
            output_multiplier_scale=float(raw.get("output_multiplier_scale") or 1.0),
            long_rope=_long_rope(raw, config, rotary_dim),
            **_gpt_block(raw, config),
            moe=MoeSpec.from_config(raw, config),
        )


def plain_options(head_size: int) -> DecoderOptions:
    """Llama's options: full rotary, 1 / sqrt(head_size), no norm on q / k, no multipliers."""
    return DecoderOptions(rotary_dim=head_size, attention_scale=head_size**-0.5)


# The activations each class with a plain MLP (TensorRT-LLM's layers/mlp.py `MLP`: proj(act(fc(x))), no mlp.gate)
# runs here: the GPT class (models/gpt/model.py) and Phi-3's (models/phi3/model.py), NVIDIA/TensorRT-LLM v1.2.0.
_PLAIN_MLP_ACTIVATIONS = MappingProxyType({"gpt": ("gelu", "squared-relu"), "phi3": ("swiglu", "silu")})


def _gpt_block(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    """The classes with a plain MLP (their rows' options check has accepted the config): the GPT class's LayerNorm and
    act(fc(x)); Phi-3's RMSNorm and, under swiglu, silu(gate) * up from fc's rows [up; gate]. The activation is the
    checkpoint's `hidden_act`, run as NVIDIA's class runs it, so a checkpoint converted with the wrong one computes
    what its engine would (and differs from transformers)."""
    family = architecture_for_checkpoint(config.architecture).family
    if family not in _PLAIN_MLP_ACTIVATIONS:
        return {}
    hidden_act, supported = raw.get("hidden_act"), _PLAIN_MLP_ACTIVATIONS[family]
    if hidden_act not in supported:
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported by the {family} class here (supported: {', '.join(supported)})")
    return {"layer_norm": family == "gpt", "ungated_activation": hidden_act}


def _long_rope(raw: Mapping[str, Any], config: ModelConfig, rotary_dim: int) -> LongRope | None:
    if raw.get("position_embedding_type") != "long_rope":
        return None
    factors = {}
    for key in ("longrope_scaling_short_factors", "longrope_scaling_long_factors"):
        values = tuple(float(f) for f in raw[key])
        if len(values) != rotary_dim // 2:
            raise ModelLoadError(f"{key} has {len(values)} factors; rotary dimension {rotary_dim} needs {rotary_dim // 2}")
        factors[key] = values
    if not config.max_position_embeddings:
        raise ModelLoadError("max_position_embeddings is required with long_rope (it sets the attention factor)")
    return LongRope(
        original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
        max_position_embeddings=int(config.max_position_embeddings),
        short_factors=factors["longrope_scaling_short_factors"],
        long_factors=factors["longrope_scaling_long_factors"],
    )

"""The Gemma family's options, read from a TensorRT-LLM checkpoint config (torch-free: the table reads it).

One model class (`model_runner.gemma.GemmaModel`) runs Gemma, Gemma 2 and Gemma 3 (text); the checkpoint's
`architecture` (the Hugging Face class, as ModelOpt and the pipeline's converter write it) names the variant,
and these keys (TensorRT-LLM 1.2's tensorrt_llm/models/gemma/config.py and the Gemma config groups of modeling_utils.py) give the rest:

- all: norms stored as 1 + w (TensorRT-LLM's RMSNorm multiplies by the stored weight; the converter adds the
  one), embeddings scaled by √hidden, GeGLU with tanh GELU (`hidden_act` gelu: TensorRT-LLM's ACT2FN computes it with the tanh form,
  transformers' gelu_pytorch_tanh, which older checkpoints of this tool name), tied embeddings;
- Gemma 2 and 3: `inter_layernorms` (pre/post feed-forward norms; true), `query_pre_attn_scalar` (scores
  scaled by its -½ power instead of head_size's), `final_logit_softcapping`;
- Gemma 2: `attn_logit_softcapping`. Its local layers (every other one, from the first) have a 4096-token
  window, which the checkpoint does not carry (TensorRT-LLM's Gemma 2 has no sliding window and is limited
  to 4096 tokens): without a `sliding_window` key every layer attends over the whole sequence and requests
  are limited to `GEMMA2_WINDOW` tokens, where that is exact; with one, the local layers are windowed;
- Gemma 3: `qk_layernorm` (q/k RMSNorm per head; true), `sliding_window`, `_sliding_window_pattern` (layer i
  is local unless (i + 1) % pattern == 0), `rope_local_base_freq` (the local layers' RoPE base; the global
  ones use `rotary_base` and `rotary_scaling`).

Anything else a Gemma checkpoint may ask for is refused at load, by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from refengine.errors import ModelLoadError

GEMMA2_WINDOW = 4096  # Gemma 2's local-layer window (every released Gemma 2; TensorRT-LLM's sequence limit)
VARIANTS = (("GemmaForCausalLM", "gemma"), ("Gemma2ForCausalLM", "gemma2"), ("Gemma3ForCausalLM", "gemma3_text"))
VISION_KEYS = ("vision_config", "vision_tower", "mm_tokens_per_image", "image_token_index")
# TensorRT-LLM's ACT2FN computes both with the tanh approximation (tensorrt_llm/functional.py, v1.2.0)
GEMMA_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class GemmaOptions:
    variant: str  # gemma | gemma2 | gemma3_text
    inter_layernorms: bool
    qk_layernorm: bool
    query_pre_attn_scalar: float | None  # None: scale by head_size ** -0.5 (Gemma 1)
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    layer_windows: tuple[int | None, ...]  # per layer: its sliding window, None for global attention
    local_rotary_base: float | None  # Gemma 3's local layers' RoPE base
    max_request_tokens: int | None  # prompt + max_tokens limit (Gemma 2 without its window), None: none

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> GemmaOptions:
        """The options of a Gemma checkpoint config; ModelLoadError naming what refengine does not implement."""
        architecture = raw.get("architecture")
        variant = dict(VARIANTS).get(str(architecture))
        if variant is None:
            raise ModelLoadError(f"architecture {architecture!r} is not a Gemma text model ({', '.join(dict(VARIANTS))})")
        _check_common(raw, variant)
        num_layers = raw.get("num_hidden_layers")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
            raise ModelLoadError(f"checkpoint config field 'num_hidden_layers' must be a positive integer, got {num_layers!r}")
        later = variant != "gemma"
        windows: tuple[int | None, ...] = (None,) * num_layers
        limit = None
        if variant == "gemma2" and raw.get("sliding_window") is None:
            limit = GEMMA2_WINDOW
        elif later and (variant == "gemma3_text" or raw.get("sliding_window") is not None):
            window = _positive_int(raw, "sliding_window")
            pattern = _positive_int(raw, "_sliding_window_pattern", 2 if variant == "gemma2" else None)
            windows = tuple(window if (index + 1) % pattern else None for index in range(num_layers))
        return cls(
            variant=variant,
            inter_layernorms=later,
            qk_layernorm=variant == "gemma3_text",
            query_pre_attn_scalar=_positive_number(raw, "query_pre_attn_scalar") if later else None,
            attn_logit_softcapping=_optional_positive(raw, "attn_logit_softcapping") if variant == "gemma2" else None,
            final_logit_softcapping=_optional_positive(raw, "final_logit_softcapping") if later else None,
            layer_windows=windows,
            local_rotary_base=_positive_number(raw, "rope_local_base_freq") if variant == "gemma3_text" else None,
            max_request_tokens=limit,
        )


def check_gemma_options(raw: Mapping[str, Any]) -> None:
    """The architecture table's options check for the three Gemma rows."""
    GemmaOptions.from_config(raw)


def _check_common(raw: Mapping[str, Any], variant: str) -> None:
    for key in VISION_KEYS:
        if raw.get(key) is not None:
            raise ModelLoadError(f"{key} is set: Gemma 3's vision tower is not supported (refengine runs the text model only)")
    hidden_act = raw.get("hidden_act", "gelu")
    if hidden_act not in GEMMA_ACTIVATIONS:
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported for {variant} (supported: {', '.join(GEMMA_ACTIVATIONS)})")
    position_embedding = raw.get("position_embedding_type", "rope_gpt_neox")
    if position_embedding != "rope_gpt_neox":
        raise ModelLoadError(f"position_embedding_type {position_embedding!r} is not supported (supported: rope_gpt_neox)")
    if raw.get("rotary_pct", 1.0) != 1.0:
        raise ModelLoadError(f"rotary_pct {raw.get('rotary_pct')} is not supported (partial rotary); expected 1.0")
    if raw.get("rmsnorm", True) is not True:
        raise ModelLoadError("rmsnorm is false; the Gemma family needs RMSNorm")
    if raw.get("residual_mlp"):
        raise ModelLoadError("residual_mlp is true; this Gemma variant is not supported")
    if raw.get("moe") and (raw["moe"].get("num_experts") or 0) > 0:
        raise ModelLoadError("moe.num_experts > 0: mixture-of-experts models are not supported")
    if raw.get("use_bidirectional_attention"):
        raise ModelLoadError("use_bidirectional_attention is true: only causal attention is supported")
    expected = {"inter_layernorms": variant != "gemma", "qk_layernorm": variant == "gemma3_text"}
    for key, value in expected.items():
        if bool(raw.get(key, value)) != value:
            raise ModelLoadError(f"{key} is {raw.get(key)!r}; {variant} has {str(value).lower()} (the layout refengine runs)")
    if variant != "gemma2" and raw.get("attn_logit_softcapping") is not None:
        raise ModelLoadError(f"attn_logit_softcapping is set; {variant} has no attention soft-capping (Gemma 2 only)")
    if variant == "gemma" and raw.get("final_logit_softcapping") is not None:
        raise ModelLoadError("final_logit_softcapping is set; Gemma 1 has no logit soft-capping")
    if variant == "gemma" and raw.get("sliding_window") is not None:
        raise ModelLoadError("sliding_window is set; Gemma 1 has no sliding-window layers")


def _positive_int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"checkpoint config field {key!r} must be a positive integer, got {value!r}")
    return value


def _positive_number(raw: Mapping[str, Any], key: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ModelLoadError(f"checkpoint config field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _optional_positive(raw: Mapping[str, Any], key: str) -> float | None:
    return None if raw.get(key) is None else _positive_number(raw, key)

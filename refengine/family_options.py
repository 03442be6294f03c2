"""The options checks of the architectures refengine runs (the rows of `refengine.architectures`): each refuses, by
name, what a family's TensorRT-LLM checkpoint config may say and refengine does not implement. Torch-free, like the
table that names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from refengine.errors import ModelLoadError

# Options of TensorRT-LLM's Phi-3 class that only Phi-3-small (block-sparse attention, muP, GeGeLU) or the
# MoE / small long-RoPE variants (their own mscales) write; none is implemented here.
_PHI3_SMALL_OPTIONS = (
    "blocksparse_block_size",
    "blocksparse_homo_head_pattern",
    "blocksparse_num_local_blocks",
    "blocksparse_vertical_stride",
    "dense_attention_every_n_layers",
    "gegelu_limit",
    "mup_attn_multiplier",
    "mup_embedding_multiplier",
    "mup_use_scaling",
    "mup_width_multiplier",
    "longrope_long_mscale",
    "longrope_short_mscale",
)
# Granite's multipliers (TensorRT-LLM's LLaMA class; 1.0 leaves a Llama unchanged). attention_multiplier is
# 1 / q_scaling: the softmax scale is attention_multiplier / sqrt(head_size).
GRANITE_MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "output_multiplier_scale")


def _check_decoder_options(
    raw: Mapping[str, Any],
    *,
    qk_layernorm: bool = False,
    partial_rotary: bool = False,
    long_rope: bool = False,
    multipliers: bool = False,
    moe: bool = False,
) -> None:
    """Refuse what the Llama decoder does not implement; the keyword flags name the options a family adds."""
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swiglu"):
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported (supported: silu)")
    position_embedding = raw.get("position_embedding_type", "rope_gpt_neox")
    allowed = ("rope_gpt_neox", "long_rope") if long_rope else ("rope_gpt_neox",)
    if position_embedding not in allowed:
        raise ModelLoadError(f"position_embedding_type {position_embedding!r} is not supported (supported: {', '.join(allowed)})")
    rotary_pct = raw.get("rotary_pct", 1.0)
    if partial_rotary:
        if isinstance(rotary_pct, bool) or not isinstance(rotary_pct, (int, float)) or not 0 < rotary_pct <= 1:
            raise ModelLoadError(f"rotary_pct {rotary_pct!r} must be a number in (0, 1]")
    elif rotary_pct != 1.0:
        raise ModelLoadError(f"rotary_pct {rotary_pct} is not supported (partial rotary); expected 1.0")
    if raw.get("rmsnorm", True) is not True:
        raise ModelLoadError("rmsnorm is false; the Llama family needs RMSNorm")
    if raw.get("residual_mlp"):
        raise ModelLoadError("residual_mlp is true; this Llama variant is not supported")
    if raw.get("qk_layernorm") and not qk_layernorm:
        raise ModelLoadError("qk_layernorm is true; this Llama variant is not supported")
    if not multipliers:
        for key in GRANITE_MULTIPLIERS:
            if raw.get(key) not in (None, 1.0):
                raise ModelLoadError(f"{key} {raw[key]} is not supported by this family (Granite's multipliers)")
    if not moe and raw.get("moe") and (raw["moe"].get("num_experts") or 0) > 0:
        raise ModelLoadError("moe.num_experts > 0: mixture-of-experts models are not supported")


def check_llama_options(raw: Mapping[str, Any]) -> None:
    """Refuse the options of a TensorRT-LLM config that `LlamaModel` does not implement."""
    _check_decoder_options(raw)


def check_qwen3_options(raw: Mapping[str, Any]) -> None:
    """Qwen3 dense: the Llama decoder with per-head q/k RMSNorm (`qk_layernorm`, required)."""
    if raw.get("qk_layernorm") is not True:
        raise ModelLoadError("qk_layernorm must be true for qwen_type 'qwen3' (Qwen3 normalizes q and k per head)")
    _check_decoder_options(raw, qk_layernorm=True)


def check_granite_options(raw: Mapping[str, Any]) -> None:
    """Granite 3 dense: the Llama decoder with embedding, attention, residual and logits multipliers."""
    _check_decoder_options(raw, multipliers=True)
    for key in GRANITE_MULTIPLIERS:
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ModelLoadError(f"{key} must be a positive number, got {value!r}")


def check_phi3_options(raw: Mapping[str, Any]) -> None:
    """Phi-3 / Phi-4 dense: partial rotary and long-RoPE; Phi-3-small's and PhiMoE's options are refused by name."""
    for key in _PHI3_SMALL_OPTIONS:
        if raw.get(key) is not None:
            what = "block-sparse attention (Phi-3-small)" if key.startswith(("blocksparse", "dense_attention")) else "Phi-3-small / PhiMoE"
            raise ModelLoadError(f"{key} is set: {what} is not supported by the reference engine")
    _check_decoder_options(raw, partial_rotary=True, long_rope=True)
    if raw.get("position_embedding_type") == "long_rope":
        _check_long_rope(raw)


def check_mixtral_options(raw: Mapping[str, Any]) -> None:
    """Mixtral: the Llama decoder whose MLP is a mixture of experts (`moe`, experts of intermediate_size)."""
    _check_decoder_options(raw, moe=True)
    check_moe_options(raw)


def check_qwen_moe_options(raw: Mapping[str, Any]) -> None:
    """Qwen2-MoE (q/k/v bias, a shared expert behind a sigmoid gate) and Qwen3-MoE (q/k RMSNorm): experts of
    moe_intermediate_size."""
    qwen3 = raw.get("qwen_type") == "qwen3_moe"
    if qwen3 and raw.get("qk_layernorm") is not True:
        raise ModelLoadError("qk_layernorm must be true for qwen_type 'qwen3_moe' (Qwen3 normalizes q and k per head)")
    _check_decoder_options(raw, qk_layernorm=qwen3, moe=True)
    check_moe_options(raw)
    for key in ("moe_intermediate_size", "moe_shared_expert_intermediate_size"):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelLoadError(f"{key} must be a non-negative integer, got {value!r}")
    if not raw.get("moe_intermediate_size"):
        raise ModelLoadError("moe_intermediate_size must be a positive integer for a Qwen MoE checkpoint")
    shared = raw.get("moe_shared_expert_intermediate_size") or 0
    if qwen3 and shared:
        raise ModelLoadError(f"moe_shared_expert_intermediate_size {shared}: Qwen3-MoE has no shared expert")
    if not qwen3 and not shared:
        raise ModelLoadError("moe_shared_expert_intermediate_size must be positive for qwen_type 'qwen2_moe' (its shared expert)")


# TensorRT-LLM's MoeConfig.ExpertScaleNormalizationMode: the routing weights of the top-k experts are the softmax over
# all experts (NONE) or renormalised to sum to 1 over the top k (RENORMALIZE, the default when the key is absent).
# SPARSE_MIXER (Phi-3.5-MoE) and the group-limited DeepSeek-V2 modes are not implemented.
MOE_NORMALIZATION_MODES = MappingProxyType({0: "NONE", 1: "RENORMALIZE"})
_MOE_UNIMPLEMENTED_MODES = MappingProxyType({2: "SPARSE_MIXER", 3: "DEVICE_LIMITED", 4: "DEVICE_LIMITED_RENORM"})


def check_moe_options(raw: Mapping[str, Any]) -> None:
    """The `moe` block of a mixture-of-experts checkpoint: softmax top-k routing over every layer's experts."""
    moe = raw.get("moe")
    if not isinstance(moe, Mapping):
        raise ModelLoadError(f"moe must be an object with num_experts and top_k for {raw.get('architecture')}, got {moe!r}")
    experts, top_k = moe.get("num_experts"), moe.get("top_k")
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 2:
        raise ModelLoadError(f"moe.num_experts must be an integer >= 2, got {experts!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ModelLoadError(f"moe.top_k must be an integer in [1, moe.num_experts = {experts}], got {top_k!r}")
    mode = moe.get("normalization_mode", 1)
    if isinstance(mode, bool) or not isinstance(mode, int) or mode not in MOE_NORMALIZATION_MODES:
        name = f" ({_MOE_UNIMPLEMENTED_MODES[mode]})" if isinstance(mode, int) and mode in _MOE_UNIMPLEMENTED_MODES else ""
        supported = ", ".join(f"{value} {label}" for value, label in MOE_NORMALIZATION_MODES.items())
        raise ModelLoadError(f"moe.normalization_mode {mode!r}{name} is not supported (supported: {supported})")
    if moe.get("shared_expert_intermediate_size"):
        raise ModelLoadError("moe.shared_expert_intermediate_size is set: shared experts inside the MoE block (DeepSeek) are not supported")
    for key in ("device_limited_n_group", "device_limited_topk_group"):
        if moe.get(key):
            raise ModelLoadError(f"moe.{key} is set: group-limited routing (DeepSeek-V2) is not supported")
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise ModelLoadError(
            "mlp_only_layers / decoder_sparse_step: dense layers between the MoE layers are not supported (every layer's MLP is the mixture of experts)"
        )
    if raw.get("mlp_bias"):
        raise ModelLoadError("mlp_bias is true: MoE experts with a bias are not supported")


def _check_long_rope(raw: Mapping[str, Any]) -> None:
    original = raw.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original <= 1:
        raise ModelLoadError(f"original_max_position_embeddings must be an integer > 1 for long_rope, got {original!r}")
    for key in ("longrope_scaling_short_factors", "longrope_scaling_long_factors"):
        factors = raw.get(key)
        if not isinstance(factors, list) or not factors or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
            raise ModelLoadError(f"{key} must be a non-empty list of positive numbers for long_rope, got {factors!r}")
    scaling = raw.get("rotary_scaling") or {}
    # TensorRT-LLM scales cos/sin by sqrt(1 + ln(max_position_embeddings / original) / ln(original)) and
    # reads neither of these; transformers would use them instead.
    for key in ("factor", "attention_factor"):
        if scaling.get(key) is not None:
            raise ModelLoadError(
                f"rotary_scaling.{key} is not supported with long_rope (TensorRT-LLM derives the scale "
                "from max_position_embeddings / original_max_position_embeddings)"
            )


# TensorRT-LLM's GPT class (GPTConfig) options that other gpt_variants use; none is implemented here.
_GPT_UNUSED_OPTIONS = MappingProxyType(
    {
        "q_scaling": 1.0,
        "embedding_scale": None,
        "apply_query_key_layer_scaling": False,
        "inner_layernorm": False,
        "norm_before_bmm1": False,
        "qk_layernorm": False,
        "residual_mlp": False,
    }
)


def check_gpt_options(raw: Mapping[str, Any]) -> None:
    """TensorRT-LLM's GPT class as StarCoder2 and Nemotron use it: LayerNorm, rotary (partial for Nemotron), an ungated
    MLP (gelu: its tanh approximation; squared-relu), biases per `bias`. GPT-2's learned positions, Persimmon's q/k
    norm, Kosmos-2's inner LayerNorm, query-key layer scaling and MoE are refused by name."""
    if raw.get("gpt_variant") is None:
        raise ModelLoadError(
            "gpt_variant is missing: TensorRT-LLM's GPT class then runs GPT-2 (learned absolute "
            "positions), which the reference engine does not (supported: starcoder2, nemotron)"
        )
    hidden_act = raw.get("hidden_act")
    if hidden_act not in ("gelu", "squared-relu"):
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported by the GPT class here (supported: gelu, squared-relu)")
    position_embedding = raw.get("position_embedding_type", "learned_absolute")  # GPTConfig's default
    if position_embedding != "rope_gpt_neox":
        raise ModelLoadError(f"position_embedding_type {position_embedding!r} is not supported (supported: rope_gpt_neox)")
    rotary_pct = raw.get("rotary_pct", 1.0)
    if isinstance(rotary_pct, bool) or not isinstance(rotary_pct, (int, float)) or not 0 < rotary_pct <= 1:
        raise ModelLoadError(f"rotary_pct {rotary_pct!r} must be a number in (0, 1]")
    if raw.get("rmsnorm"):
        raise ModelLoadError("rmsnorm is true; the GPT class here runs LayerNorm")
    for key, neutral in _GPT_UNUSED_OPTIONS.items():
        if raw.get(key) not in (None, neutral):
            raise ModelLoadError(f"{key} {raw[key]!r} is not supported by the GPT class here (expected {neutral})")
    for key in GRANITE_MULTIPLIERS:
        if raw.get(key) not in (None, 1.0):
            raise ModelLoadError(f"{key} {raw[key]} is not supported by this family (Granite's multipliers)")
    if raw.get("moe") and (raw["moe"].get("num_experts") or 0) > 0:
        raise ModelLoadError("moe.num_experts > 0: mixture-of-experts models are not supported")

"""The decoder architectures refengine runs: one row per family, read by everything that builds a model.

A row names the TensorRT-LLM checkpoint `architecture` values it covers, the Hugging Face
`model_type`s whose export produces it (with ModelOpt's `decoder_type`), the model class that runs
it, the check of the family's config options, and what else a checkpoint of it must say. The
pipeline reads the same rows: its validation accepts exactly these Hugging Face model types and its
export picks the decoder type from them (TensorRT-LLM runs more architectures; facts about those
stay in the pipeline's engine backend).

Torch-free: the model class is named, and imported only when a model is loaded, so the pipeline's
`validate` reads this table without loading torch.

Adding an architecture: write its model class under `model_runner/` (it implements
`model_runner.decoder.DecoderModel` and reads any option of its own from `checkpoint.raw_config`),
write its options check below if the Llama one does not fit, and add its row to `ARCHITECTURES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from refengine.errors import ModelLoadError

# Options of TensorRT-LLM's Phi-3 class that only Phi-3-small (block-sparse attention, muP, GeGeLU) or the
# MoE / small long-RoPE variants (their own mscales) write; none is implemented here.
_PHI3_SMALL_OPTIONS = (
    "blocksparse_block_size", "blocksparse_homo_head_pattern", "blocksparse_num_local_blocks",
    "blocksparse_vertical_stride", "dense_attention_every_n_layers", "gegelu_limit", "mup_attn_multiplier",
    "mup_embedding_multiplier", "mup_use_scaling", "mup_width_multiplier", "longrope_long_mscale",
    "longrope_short_mscale",
)
# Granite's multipliers (TensorRT-LLM's LLaMA class; 1.0 leaves a Llama unchanged). attention_multiplier is
# 1 / q_scaling: the softmax scale is attention_multiplier / sqrt(head_size).
GRANITE_MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "output_multiplier_scale")


def _check_decoder_options(
    raw: Mapping[str, Any], *, qk_layernorm: bool = False, partial_rotary: bool = False,
    long_rope: bool = False, multipliers: bool = False, moe: bool = False,
) -> None:
    """Refuse what the Llama decoder does not implement; the keyword flags name the options a family adds."""
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swiglu"):
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported (supported: silu)")
    position_embedding = raw.get("position_embedding_type", "rope_gpt_neox")
    allowed = ("rope_gpt_neox", "long_rope") if long_rope else ("rope_gpt_neox",)
    if position_embedding not in allowed:
        raise ModelLoadError(
            f"position_embedding_type {position_embedding!r} is not supported (supported: {', '.join(allowed)})"
        )
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
        raise ModelLoadError("moe.shared_expert_intermediate_size is set: shared experts inside the MoE block "
                             "(DeepSeek) are not supported")
    for key in ("device_limited_n_group", "device_limited_topk_group"):
        if moe.get(key):
            raise ModelLoadError(f"moe.{key} is set: group-limited routing (DeepSeek-V2) is not supported")
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise ModelLoadError("mlp_only_layers / decoder_sparse_step: dense layers between the MoE layers are not "
                             "supported (every layer's MLP is the mixture of experts)")
    if raw.get("mlp_bias"):
        raise ModelLoadError("mlp_bias is true: MoE experts with a bias are not supported")


def _check_long_rope(raw: Mapping[str, Any]) -> None:
    original = raw.get("original_max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original <= 1:
        raise ModelLoadError(f"original_max_position_embeddings must be an integer > 1 for long_rope, got {original!r}")
    for key in ("longrope_scaling_short_factors", "longrope_scaling_long_factors"):
        factors = raw.get(key)
        if not isinstance(factors, list) or not factors or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors
        ):
            raise ModelLoadError(f"{key} must be a non-empty list of positive numbers for long_rope, got {factors!r}")
    scaling = raw.get("rotary_scaling") or {}
    # TensorRT-LLM scales cos/sin by sqrt(1 + ln(max_position_embeddings / original) / ln(original)) and
    # reads neither of these; transformers would use them instead.
    for key in ("factor", "attention_factor"):
        if scaling.get(key) is not None:
            raise ModelLoadError(f"rotary_scaling.{key} is not supported with long_rope (TensorRT-LLM derives the scale "
                                 "from max_position_embeddings / original_max_position_embeddings)")


@dataclass(frozen=True)
class Architecture:
    family: str
    checkpoint_architectures: tuple[str, ...]  # TensorRT-LLM checkpoint `architecture` values
    hf_model_types: tuple[str, ...]  # Hugging Face `model_type`s exported to it
    checkpoint_decoder: str  # ModelOpt's `decoder_type` for the export (TensorRT-LLM's model family)
    model_class: str  # "module:Class" implementing DecoderModel
    check_options: Callable[[Mapping[str, Any]], None]  # raises ModelLoadError naming the option
    qkv_bias: bool = False  # q/k/v carry a bias whatever the checkpoint's `attn_bias` says
    # When one TensorRT-LLM class covers several layouts, the config key that names the layout
    # (the Hugging Face model_type is its value) and the layouts the model class runs.
    variant_key: str | None = None
    variants: tuple[str, ...] = ()
    notes: str = ""

    def check_variant(self, raw: Mapping[str, Any]) -> None:
        value = raw.get(self.variant_key) if self.variant_key else None
        if value is not None and value not in self.variants:
            raise ModelLoadError(f"{self.variant_key} {value!r} is not supported (supported: {', '.join(self.variants)})")

    def load_model_class(self) -> type:
        """The model class (importing it loads torch)."""
        module, _, name = self.model_class.partition(":")
        return getattr(importlib.import_module(module), name)


ARCHITECTURES = (
    Architecture(
        family="llama",
        checkpoint_architectures=("LlamaForCausalLM", "MistralForCausalLM"),
        hf_model_types=("llama", "mistral"),
        checkpoint_decoder="llama",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_llama_options,
        notes="Llama 2/3 (incl. llama3 RoPE scaling) and Mistral: RMSNorm, SwiGLU, GQA, RoPE, tied embeddings",
    ),
    Architecture(
        family="qwen2",
        checkpoint_architectures=("QWenForCausalLM", "Qwen2ForCausalLM"),
        hf_model_types=("qwen2",),
        checkpoint_decoder="qwen",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_llama_options,
        qkv_bias=True,
        # TensorRT-LLM's QWenForCausalLM also covers Qwen 1, Qwen2-MoE and Qwen3, whose layouts differ.
        variant_key="qwen_type",
        variants=("qwen2",),
        notes="Qwen2-style biases: the Llama decoder with a bias on q/k/v",
    ),
    Architecture(
        family="qwen3",
        checkpoint_architectures=("Qwen3ForCausalLM",),
        hf_model_types=("qwen3",),
        checkpoint_decoder="qwen",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_qwen3_options,
        variant_key="qwen_type",
        variants=("qwen3",),
        notes="Qwen3 dense: the Llama decoder with per-head q/k RMSNorm, head_dim independent of hidden / heads, no bias",
    ),
    Architecture(
        family="granite",
        checkpoint_architectures=("GraniteForCausalLM",),
        hf_model_types=("granite",),
        checkpoint_decoder="llama",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_granite_options,
        notes="Granite 3 dense: the Llama decoder with embedding, attention, residual and logits multipliers",
    ),
    Architecture(
        family="phi3",
        # TensorRT-LLM's Phi3ForCausalLM class also covers Phi-3-small and PhiMoE: their checkpoints are
        # refused by their options (block-sparse attention, muP, MoE), named.
        checkpoint_architectures=("Phi3ForCausalLM", "Phi3SmallForCausalLM", "PhiMoEForCausalLM"),
        hf_model_types=("phi3",),
        checkpoint_decoder="phi3",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_phi3_options,
        notes="Phi-3 / 3.5 / Phi-4 / Phi-4-mini: the Llama decoder (fused qkv / gate_up split by the converter), "
        "partial rotary, long-RoPE short/long factors for the 128k variants",
    ),
    Architecture(
        family="mixtral",
        checkpoint_architectures=("MixtralForCausalLM",),
        hf_model_types=("mixtral",),
        checkpoint_decoder="llama",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_mixtral_options,
        notes="Mixtral: the Llama decoder with a mixture of experts (softmax top-k, renormalised) as its MLP",
    ),
    Architecture(
        family="qwen2_moe",
        checkpoint_architectures=("Qwen2MoeForCausalLM",),
        hf_model_types=("qwen2_moe",),
        checkpoint_decoder="qwen",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_qwen_moe_options,
        qkv_bias=True,
        variant_key="qwen_type",
        variants=("qwen2_moe",),
        notes="Qwen1.5/Qwen2-MoE: Qwen2's decoder with routed experts plus a shared expert behind a sigmoid gate",
    ),
    Architecture(
        family="qwen3_moe",
        checkpoint_architectures=("Qwen3MoeForCausalLM",),
        hf_model_types=("qwen3_moe",),
        checkpoint_decoder="qwen",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_qwen_moe_options,
        variant_key="qwen_type",
        variants=("qwen3_moe",),
        notes="Qwen3-MoE: Qwen3's decoder (q/k RMSNorm) with routed experts of moe_intermediate_size",
    ),
)
# In the order messages list them.
HF_MODEL_TYPES = tuple(model_type for row in ARCHITECTURES for model_type in row.hf_model_types)


def architecture_for_checkpoint(name: str) -> Architecture:
    """The row of a TensorRT-LLM checkpoint's `architecture`; ModelLoadError naming the supported ones."""
    for row in ARCHITECTURES:
        if name in row.checkpoint_architectures:
            return row
    supported = ", ".join(sorted(known for row in ARCHITECTURES for known in row.checkpoint_architectures))
    raise ModelLoadError(f"architecture {name!r} is not supported by the reference engine (supported: {supported})")


def architecture_for_hf_model_type(model_type: str) -> Architecture | None:
    """The row a Hugging Face checkpoint of `model_type` exports to, or None."""
    return next((row for row in ARCHITECTURES if model_type in row.hf_model_types), None)

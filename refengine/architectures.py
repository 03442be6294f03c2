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
from refengine.gemma_options import check_gemma_options

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
    long_rope: bool = False, multipliers: bool = False,
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
    if raw.get("moe") and (raw["moe"].get("num_experts") or 0) > 0:
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


# TensorRT-LLM's GPT class (GPTConfig) options that other gpt_variants use; none is implemented here.
_GPT_UNUSED_OPTIONS = MappingProxyType({
    "q_scaling": 1.0, "embedding_scale": None, "apply_query_key_layer_scaling": False, "inner_layernorm": False,
    "norm_before_bmm1": False, "qk_layernorm": False, "residual_mlp": False,
})


def check_gpt_options(raw: Mapping[str, Any]) -> None:
    """TensorRT-LLM's GPT class as StarCoder2 and Nemotron use it: LayerNorm, rotary (partial for Nemotron), an ungated
    MLP (gelu: its tanh approximation; squared-relu), biases per `bias`. GPT-2's learned positions, Persimmon's q/k
    norm, Kosmos-2's inner LayerNorm, query-key layer scaling and MoE are refused by name."""
    if raw.get("gpt_variant") is None:
        raise ModelLoadError("gpt_variant is missing: TensorRT-LLM's GPT class then runs GPT-2 (learned absolute "
                             "positions), which the reference engine does not (supported: starcoder2, nemotron)")
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


@dataclass(frozen=True)
class Architecture:
    family: str
    checkpoint_architectures: tuple[str, ...]  # TensorRT-LLM checkpoint `architecture` values
    hf_model_types: tuple[str, ...]  # Hugging Face `model_type`s exported to it
    checkpoint_decoder: str  # ModelOpt's `decoder_type` for the export (TensorRT-LLM's model family)
    model_class: str  # "module:Class" implementing DecoderModel
    check_options: Callable[[Mapping[str, Any]], None]  # raises ModelLoadError naming the option
    qkv_bias: bool = False  # q/k/v carry a bias whatever the checkpoint's `attn_bias` says
    bias_key: str | None = None  # the config key that, when true, gives every decoder Linear a bias (GPT's `bias`)
    # When one TensorRT-LLM class covers several layouts, the config key that names the layout
    # (the Hugging Face model_type is its value) and the layouts the model class runs.
    variant_key: str | None = None
    variants: tuple[str, ...] = ()
    notes: str = ""
    # Checkpoint `architecture` values of this family that refengine refuses, with why (naming the option).
    refused_architectures: tuple[tuple[str, str], ...] = ()

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
        family="gemma",
        checkpoint_architectures=("GemmaForCausalLM",),
        hf_model_types=("gemma",),
        checkpoint_decoder="gemma",
        model_class="refengine.model_runner.gemma:GemmaModel",
        check_options=check_gemma_options,
        notes="Gemma 1: (1 + w) RMSNorm, √hidden-scaled embeddings, GeGLU (tanh GELU), tied embeddings",
    ),
    Architecture(
        family="gemma2",
        checkpoint_architectures=("Gemma2ForCausalLM",),
        hf_model_types=("gemma2",),
        checkpoint_decoder="gemma",
        model_class="refengine.model_runner.gemma:GemmaModel",
        check_options=check_gemma_options,
        notes="Gemma 2: pre/post feed-forward norms, query_pre_attn_scalar, attention and final logit soft-capping; "
        "requests up to its 4096-token window (gemma_options.py)",
    ),
    Architecture(
        family="gemma3_text",
        checkpoint_architectures=("Gemma3ForCausalLM",),
        hf_model_types=("gemma3_text",),
        checkpoint_decoder="gemma",
        model_class="refengine.model_runner.gemma:GemmaModel",
        check_options=check_gemma_options,
        refused_architectures=(
            ("Gemma3ForConditionalGeneration", "Gemma 3's vision tower (vision_config) is not supported: "
             "refengine runs the text model, Gemma3ForCausalLM"),
        ),
        notes="Gemma 3 text: Gemma 2's layer plus q/k norms, sliding-window local layers with their own RoPE base",
    ),
    Architecture(
        family="gpt",
        # TensorRT-LLM's GPTForCausalLM (its own converter writes that name) also covers GPT-2, StarCoder 1,
        # Persimmon, Kosmos-2 and JAIS: refused by gpt_variant, named.
        checkpoint_architectures=("GPTForCausalLM", "Starcoder2ForCausalLM", "NemotronForCausalLM"),
        hf_model_types=("starcoder2", "nemotron"),
        checkpoint_decoder="gpt",
        model_class="refengine.model_runner.llama:LlamaModel",
        check_options=check_gpt_options,
        bias_key="bias",
        variant_key="gpt_variant",
        variants=("starcoder2", "nemotron"),
        notes="StarCoder2 and Nemotron-3/4 / Minitron (TensorRT-LLM's GPT class): the Llama decoder with LayerNorm "
        "(+ bias), an ungated GELU (tanh) or squared-ReLU MLP, biases per `bias`, partial rotary (Nemotron); "
        "StarCoder2's sliding window is not applied (as trtllm-build's engine)",
    ),
)
# In the order messages list them.
HF_MODEL_TYPES = tuple(model_type for row in ARCHITECTURES for model_type in row.hf_model_types)


def architecture_for_checkpoint(name: str) -> Architecture:
    """The row of a TensorRT-LLM checkpoint's `architecture`; ModelLoadError naming the supported ones."""
    for row in ARCHITECTURES:
        if name in row.checkpoint_architectures:
            return row
        refused = dict(row.refused_architectures).get(name)
        if refused is not None:
            raise ModelLoadError(f"architecture {name!r} is not supported by the reference engine: {refused}")
    supported = ", ".join(sorted(known for row in ARCHITECTURES for known in row.checkpoint_architectures))
    raise ModelLoadError(f"architecture {name!r} is not supported by the reference engine (supported: {supported})")


def architecture_for_hf_model_type(model_type: str) -> Architecture | None:
    """The row a Hugging Face checkpoint of `model_type` exports to, or None."""
    return next((row for row in ARCHITECTURES if model_type in row.hf_model_types), None)

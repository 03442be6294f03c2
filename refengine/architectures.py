"""The decoder architectures refengine runs: one row per family, read by everything that builds a model.

A row names the TensorRT-LLM checkpoint `architecture` values it covers, the Hugging Face
`model_type`s whose checkpoints produce it (with TensorRT-LLM's decoder class, ModelOpt's `decoder_type`), the
model class that runs it, the check of the family's config options (`family_options.py`, `gemma_options.py`),
and what else a checkpoint of it must say. The pipeline's family table (`pipeline/config/families.py`) reads
HF_MODEL_TYPES for its cpu column: the cpu target takes exactly these model types.

Torch-free: the model class is named, and imported only when a model is loaded, so the pipeline's
`validate` reads this table without loading torch.

Adding an architecture: write its model class under `model_runner/` (it implements
`model_runner.decoder.DecoderModel` and reads any option of its own from `checkpoint.raw_config`),
write its options check in `family_options.py` if the Llama one does not fit, and add its row to `ARCHITECTURES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from refengine.errors import ModelLoadError
from refengine.family_options import (
    check_gpt_options,
    check_granite_options,
    check_llama_options,
    check_mixtral_options,
    check_phi3_options,
    check_qwen3_options,
    check_qwen_moe_options,
)
from refengine.gemma_options import check_gemma_options

if TYPE_CHECKING:
    from refengine.model_runner.decoder import DecoderModel


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
    # TensorRT-LLM's model has one fused MLP input Linear (rows [up; gate]) that its LoRA module mlp_h_to_4h adapts, and
    # no mlp_gate module (Phi-3: models/phi3/model.py maps gate_up_proj and up_proj to mlp_h_to_4h).
    lora_fused_gate_up: bool = False

    def check_variant(self, raw: Mapping[str, Any]) -> None:
        value = raw.get(self.variant_key) if self.variant_key else None
        if value is not None and value not in self.variants:
            raise ModelLoadError(f"{self.variant_key} {value!r} is not supported (supported: {', '.join(self.variants)})")

    def load_model_class(self) -> type[DecoderModel]:
        """The model class (importing it loads torch)."""
        module, _, name = self.model_class.partition(":")
        model_class: type[DecoderModel] = getattr(importlib.import_module(module), name)  # each family's class implements it
        return model_class


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
        lora_fused_gate_up=True,
        notes="Phi-3 / 3.5 / Phi-4 / Phi-4-mini: the Llama decoder (fused qkv split by the converter) with TensorRT-LLM's "
        "plain MLP (swiglu over one fc of rows [up; gate]), partial rotary, long-RoPE short/long factors for the 128k variants",
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
            ("Gemma3ForConditionalGeneration", "Gemma 3's vision tower (vision_config) is not supported: refengine runs the text model, Gemma3ForCausalLM"),
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
        refused = dict(row.refused_architectures).get(name)
        if refused is not None:
            raise ModelLoadError(f"architecture {name!r} is not supported by the reference engine: {refused}")
    supported = ", ".join(sorted(known for row in ARCHITECTURES for known in row.checkpoint_architectures))
    raise ModelLoadError(f"architecture {name!r} is not supported by the reference engine (supported: {supported})")

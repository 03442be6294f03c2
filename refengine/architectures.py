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
from typing import Any

from refengine.errors import ModelLoadError


def check_llama_options(raw: Mapping[str, Any]) -> None:
    """Refuse the options of a TensorRT-LLM config that `LlamaModel` does not implement."""
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swiglu"):
        raise ModelLoadError(f"hidden_act {hidden_act!r} is not supported (supported: silu)")
    position_embedding = raw.get("position_embedding_type", "rope_gpt_neox")
    if position_embedding != "rope_gpt_neox":
        raise ModelLoadError(
            f"position_embedding_type {position_embedding!r} is not supported (supported: rope_gpt_neox)"
        )
    rotary_pct = raw.get("rotary_pct", 1.0)
    if rotary_pct != 1.0:
        raise ModelLoadError(f"rotary_pct {rotary_pct} is not supported (partial rotary); expected 1.0")
    if raw.get("rmsnorm", True) is not True:
        raise ModelLoadError("rmsnorm is false; the Llama family needs RMSNorm")
    for flag in ("residual_mlp", "qk_layernorm"):
        if raw.get(flag):
            raise ModelLoadError(f"{flag} is true; this Llama variant is not supported")
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

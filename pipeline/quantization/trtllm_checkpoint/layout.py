"""Where each TensorRT-LLM checkpoint tensor comes from in a Hugging Face checkpoint, per model family.

The weight layout of the converter (pipeline.quantization.trtllm_checkpoint.convert): Hugging Face module names inside
`model.layers.{i}.` and at the top, and the TensorRT-LLM names they become inside `transformer.layers.{i}.` (q/k/v
→ attention.qkv, o_proj → attention.dense, gate_proj → mlp.fc, up_proj → mlp.gate, down_proj → mlp.proj). Sources
of the names: ModelOpt 0.47's `layer_utils.build_decoder_config` / `build_attention_config` (what its TRT export
wrote, Qwen3 and Gemma 2/3 norms included) and TensorRT-LLM's `models/model_weights_loader.py` key lists (Phi-3:
`qkv_proj` split into q/k/v). Phi-3's MLP is not gated in TensorRT-LLM: `Phi3DecoderLayer` uses the plain `MLP` with
`hidden_act: swiglu`, one `mlp.fc` of [2·I, H] whose rows are [up; gate] (NVIDIA/TensorRT-LLM v1.2.0
tensorrt_llm/models/phi3/model.py, models/phi3/convert.py swaps the halves of HF's gate_up_proj, layers/mlp.py `MLP`,
functional.py `swiglu`: silu of the second half times the first). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.errors import StageError


@dataclass(frozen=True)
class MoeLayout:
    """A mixture-of-experts block: per-expert Linears `<block>.experts.<e>.<name>` (transformers' hub names, which
    ModelOpt's unified export and save_pretrained write), the router and Qwen2-MoE's shared expert."""

    block: str  # "block_sparse_moe" (Mixtral) or "mlp" (Qwen MoE)
    gate: str = "gate_proj"  # the activated branch: the second half of TensorRT-LLM's fused mlp.fc
    up: str = "up_proj"  # the linear branch: the first half of mlp.fc
    down: str = "down_proj"  # TensorRT-LLM's mlp.proj
    router: str = "gate"
    shared_expert: str | None = None  # Qwen2-MoE: <block>.shared_expert.{gate,up,down}_proj
    shared_expert_gate: str | None = None  # Qwen2-MoE: <block>.shared_expert_gate, [1, hidden]


@dataclass(frozen=True)
class Layout:
    """One family's weight layout. Linear names are relative to a decoder layer; `None` means the family has none."""

    model_types: tuple[str, ...]
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    dense: str = "self_attn.o_proj"
    fc: str = "mlp.gate_proj"  # TensorRT-LLM's mlp.fc: the gated (activation) branch
    gate: str | None = "mlp.up_proj"  # TensorRT-LLM's mlp.gate: the linear branch
    proj: str = "mlp.down_proj"
    # TensorRT-LLM layer norm name -> Hugging Face name, inside a decoder layer
    norms: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType(
            {
                "input_layernorm": "input_layernorm",
                "post_layernorm": "post_attention_layernorm",
            }
        )
    )
    # Fused Hugging Face Linears (Phi-3): rows [q; k; v], split into TensorRT-LLM's q/k/v; and [gate; up], written
    # as one `mlp.fc` of rows [up; gate] per rank (the plain MLP under swiglu), with no `mlp.gate`
    qkv_fused: str | None = None
    gate_up_fused: str | None = None
    # Gemma's RMSNorm and Nemotron's LayerNorm1P multiply by (1 + weight); TensorRT-LLM's norms by weight, so 1 is
    # added (ModelOpt's layer_utils._weights_plus_one; TensorRT-LLM's gpt/convert.py apply_layernorm_1p)
    norm_plus_one: bool = False
    embedding: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    layers: str = "model.layers"
    moe: MoeLayout | None = None  # experts instead of the dense gate/up/down

    def hf_to_trtllm(self, hf_name: str) -> str | None:
        """The TensorRT-LLM module a Hugging Face module name (or `*` pattern) of hf_quant_config's exclude list
        becomes; None for modules that have no quantization of their own in TensorRT-LLM (the embedding)."""
        if hf_name == "lm_head":
            return "lm_head"
        if hf_name == self.embedding:
            return None
        prefix = f"{self.layers}."
        if hf_name.startswith(prefix):
            index, _, rest = hf_name[len(prefix) :].partition(".")
            for trt, hf in self._linear_names().items():
                if rest == hf:
                    return f"transformer.layers.{index}.{trt}"
        raise StageError(f"hf_quant_config.json: exclude_modules entry {hf_name!r} has no TensorRT-LLM name here")

    def _linear_names(self) -> dict[str, str]:
        names = {"attention.dense": self.dense, "mlp.fc": self.fc, "mlp.proj": self.proj}
        if self.moe is not None:  # the router and the shared expert's gate stay 16-bit (ModelOpt excludes them)
            block = self.moe.block
            names = {"attention.dense": self.dense, "mlp.router": f"{block}.{self.moe.router}"}
            if self.moe.shared_expert_gate:
                names["mlp.shared_expert_gate"] = f"{block}.{self.moe.shared_expert_gate}"
            return names
        if self.gate:
            names["mlp.gate"] = self.gate
        return names


_LLAMA_NORMS = {"input_layernorm": "input_layernorm", "post_layernorm": "post_attention_layernorm"}
_QK_NORMS = {"attention.q_layernorm": "self_attn.q_norm", "attention.k_layernorm": "self_attn.k_norm"}
_GEMMA2_NORMS = {
    **_LLAMA_NORMS,
    "pre_feedforward_layernorm": "pre_feedforward_layernorm",
    "post_feedforward_layernorm": "post_feedforward_layernorm",
}

LAYOUTS = (
    Layout(model_types=("llama", "mistral", "qwen2", "granite")),
    Layout(model_types=("qwen3",), norms=MappingProxyType({**_LLAMA_NORMS, **_QK_NORMS})),
    Layout(model_types=("gemma",), norm_plus_one=True),
    Layout(model_types=("gemma2",), norms=MappingProxyType(_GEMMA2_NORMS), norm_plus_one=True),
    Layout(model_types=("gemma3_text",), norms=MappingProxyType({**_GEMMA2_NORMS, **_QK_NORMS}), norm_plus_one=True),
    Layout(model_types=("phi3",), fc="mlp.gate_up_proj", gate=None, qkv_fused="self_attn.qkv_proj", gate_up_fused="mlp.gate_up_proj"),
    # GPTForCausalLM (models/gpt/convert.py): no gate; LayerNorm with a bias; Nemotron's LayerNorm1P multiplies by
    # (1 + weight), and TensorRT-LLM's convert adds the 1 to the input, post and final norms
    Layout(model_types=("starcoder2",), fc="mlp.c_fc", gate=None, proj="mlp.c_proj"),
    Layout(model_types=("nemotron",), fc="mlp.up_proj", gate=None, proj="mlp.down_proj", norm_plus_one=True),
    Layout(model_types=("mixtral",), moe=MoeLayout(block="block_sparse_moe", gate="w1", up="w3", down="w2")),
    Layout(model_types=("qwen2_moe",), moe=MoeLayout(block="mlp", shared_expert="shared_expert", shared_expert_gate="shared_expert_gate")),
    Layout(model_types=("qwen3_moe",), norms=MappingProxyType({**_LLAMA_NORMS, **_QK_NORMS}), moe=MoeLayout(block="mlp")),
)
# Mixture-of-experts families this converter does not stack yet (no family row builds them on the engine target)
MOE_MODEL_TYPES = ("granitemoe", "phimoe")


def layout_for(model_type: str) -> Layout:
    if model_type in MOE_MODEL_TYPES:
        raise StageError(f"the TensorRT-LLM converter does not convert mixture-of-experts model_type {model_type!r} yet")
    for layout in LAYOUTS:
        if model_type in layout.model_types:
            return layout
    known = ", ".join(t for layout in LAYOUTS for t in layout.model_types)
    raise StageError(f"the TensorRT-LLM converter has no weight layout for model_type {model_type!r} (has: {known})")

"""TensorRT-LLM's LoRA modules, and where each lands in a refengine decoder layer. Torch-free.

Module ids are TensorRT-LLM's (`tensorrt_llm/lora_manager.py`, `LoraManager.LORA_MODULE_IDS`; the C++
`LoraModule::ModuleType` has the same numbering): the first column of every `lora_config` row. A row's weights are
`A` [rank, in] then `B` [out, rank], flattened (`runtime/loraCache.cpp` `copyToPages`: `weightsIn` [adapterSize, inDim],
`weightsOut` [outDim, adapterSize]); the adapter's output is x Aᵀ Bᵀ, added to the Linear's output.

A module's in / out dimensions are those of the Linear it adapts (TensorRT-LLM's `LoraModule::createLoraModules`
gives attn_dense an input of `hidden` even where heads × head_size differs from it, e.g. Qwen3, Gemma; here the
input is the Linear's own, heads × head_size, which is what a PEFT adapter's o_proj `lora_A` holds).

A TensorRT-LLM checkpoint fuses q/k/v into one Linear (`attention.qkv`, rows [q; k; v]); a gated MLP keeps `fc` (HF
gate_proj, the activated branch), `gate` (HF up_proj) and `proj` (HF down_proj) apart. So attn_q / attn_k / attn_v
adapt column ranges of the qkv output. Phi-3's plain MLP has one `mlp.fc` of rows [up; gate] (`models/phi3/convert.py`
swaps the halves of HF's gate_up_proj, and `examples/hf_lora_convert.py` its lora_B), which `mlp_h_to_4h` adapts whole.

The LoRA updates of a layer are grouped by the input they read ("sites"): q/k/v/qkv read the attention input and
write the qkv output; mlp_h_to_4h and mlp_gate read the MLP input and write fc's and gate's outputs.

Mixture-of-experts layers: TensorRT-LLM's expert modules (moe_h_to_4h, moe_4h_to_h, moe_gate, moe_router; its C++
`LoraModule` sizes them hidden × experts, beside a "TODO(TRTLLM-379): Support MOE LoRA weights", and hf_lora_convert.py
writes no expert rows) are not run here: LoRA adapts their attention only, and a row for another module is refused.

An update reads its Linear's input. Where a quantized checkpoint folded an activation scale into the norm before the
Linear (ModelOpt's SmoothQuant / AWQ export averages q/k/v's pre-quant scales into the input norm), that input is the
scaled one and the update is not the adapter's; TensorRT-LLM's build refuses LoRA with INT8 SmoothQuant weights. FP8
and INT8 weight-only Linears read the model's own input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType

LORA_MODULE_IDS = MappingProxyType(
    {
        "attn_qkv": 0,
        "attn_q": 1,
        "attn_k": 2,
        "attn_v": 3,
        "attn_dense": 4,
        "mlp_h_to_4h": 5,
        "mlp_4h_to_h": 6,
        "mlp_gate": 7,
        "cross_attn_qkv": 8,
        "cross_attn_q": 9,
        "cross_attn_k": 10,
        "cross_attn_v": 11,
        "cross_attn_dense": 12,
        "moe_h_to_4h": 13,
        "moe_4h_to_h": 14,
        "moe_gate": 15,
        "moe_router": 16,
        "mlp_router": 17,
        "mlp_gate_up": 18,
    }
)
LORA_MODULE_NAMES = MappingProxyType({module_id: name for name, module_id in LORA_MODULE_IDS.items()})


def module_name(module_id: int) -> str:
    return LORA_MODULE_NAMES.get(module_id, f"unknown id {module_id}")


class Site(str, enum.Enum):
    """An input of a decoder layer that LoRA modules read, and the Linear outputs they add to."""

    QKV = "qkv"  # attention input -> qkv output [q | k | v]
    DENSE = "dense"  # attention output -> dense output
    MLP_IN = "mlp_in"  # MLP input -> fc output, then gate output (gated MLPs)
    PROJ = "proj"  # activated MLP -> proj output


@dataclass(frozen=True)
class ModelLoraShape:
    """What decides which modules a model has and their dimensions."""

    num_layers: int
    hidden_size: int
    q_size: int  # heads × head_size
    kv_size: int  # kv heads × head_size
    mlp_size: int | None  # the dense MLP's inner size; None: the MLP is a mixture of experts (no dense MLP modules)
    gated_mlp: bool = True  # fc and gate (SwiGLU / GeGLU); False: the GPT class's ungated fc
    fused_gate_up: bool = False  # TensorRT-LLM's Phi-3: one fc [up; gate] (2 × mlp_size rows), no mlp_gate

    def site_widths(self) -> dict[Site, tuple[int, ...]]:
        """The widths of each site's outputs (the Linears a site's updates add to, in order)."""
        widths: dict[Site, tuple[int, ...]] = {Site.QKV: (self.q_size + 2 * self.kv_size,), Site.DENSE: (self.hidden_size,)}
        if self.mlp_size is not None:
            if self.fused_gate_up:
                widths[Site.MLP_IN] = (2 * self.mlp_size,)
            else:
                widths[Site.MLP_IN] = (self.mlp_size, self.mlp_size) if self.gated_mlp else (self.mlp_size,)
            widths[Site.PROJ] = (self.hidden_size,)
        return widths


@dataclass(frozen=True)
class ModuleTarget:
    """One module: its site, its in / out features, and where its B rows land among the site's output columns:
    (first B row, first site column, count) per contiguous piece."""

    site: Site
    in_features: int
    out_features: int
    placements: tuple[tuple[int, int, int], ...]


def module_targets(shape: ModelLoraShape, enabled: tuple[str, ...] | None = None) -> dict[int, ModuleTarget]:
    """The modules this model runs, by id (restricted to `enabled` names, the build's lora_target_modules, if given)."""
    hidden, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    targets = {
        LORA_MODULE_IDS["attn_qkv"]: ModuleTarget(Site.QKV, hidden, q + 2 * kv, ((0, 0, q + 2 * kv),)),
        LORA_MODULE_IDS["attn_q"]: ModuleTarget(Site.QKV, hidden, q, ((0, 0, q),)),
        LORA_MODULE_IDS["attn_k"]: ModuleTarget(Site.QKV, hidden, kv, ((0, q, kv),)),
        LORA_MODULE_IDS["attn_v"]: ModuleTarget(Site.QKV, hidden, kv, ((0, q + kv, kv),)),
        LORA_MODULE_IDS["attn_dense"]: ModuleTarget(Site.DENSE, q, hidden, ((0, 0, hidden),)),
    }
    inner = shape.mlp_size
    if inner is not None:
        if shape.fused_gate_up:  # B rows [up; gate], fc's own rows
            targets[LORA_MODULE_IDS["mlp_h_to_4h"]] = ModuleTarget(Site.MLP_IN, hidden, 2 * inner, ((0, 0, 2 * inner),))
        else:
            targets[LORA_MODULE_IDS["mlp_h_to_4h"]] = ModuleTarget(Site.MLP_IN, hidden, inner, ((0, 0, inner),))
            if shape.gated_mlp:
                targets[LORA_MODULE_IDS["mlp_gate"]] = ModuleTarget(Site.MLP_IN, hidden, inner, ((0, inner, inner),))
        targets[LORA_MODULE_IDS["mlp_4h_to_h"]] = ModuleTarget(Site.PROJ, inner, hidden, ((0, 0, hidden),))
    if enabled is not None:
        targets = {module_id: target for module_id, target in targets.items() if module_name(module_id) in enabled}
    return targets

"""The mixture-of-experts block of one decoder layer: unified checkpoint -> TensorRT-LLM tensors (unquantized, FP8).

TensorRT-LLM's `layers/moe.py` (MixtureOfExperts, MOEWeightWrapper) and `models/qwen/convert.py` fix the layout:

  * `mlp.router.weight` [E, hidden], float32 (the router is a RowLinear of dtype float32 with tp_size 1: never
    sharded, never quantized; ModelOpt lists it in exclude_modules);
  * `mlp.fc.weight` [E, 2 * I / tp, hidden]: per expert the up (w3) rows, then the gate (w1) rows, each sharded
    over TP ranks before they are concatenated (MOEWeightWrapper: "the left matrix is a linear projection, the
    right matrix is the gating value"); `mlp.proj.weight` [E, hidden, I / tp] (row-parallel); mapping
    moe_tp_size = tp_size, moe_ep_size 1 (no expert parallelism);
  * FP8: `weights_scaling_factor` float32 (E, 1) for fc and for proj, so an expert's gate and up share one scale
    (the max of the two, the FP8 weight re-quantized to it, as ModelOpt's `preprocess_linear_fusion` does);
    `activation_scaling_factor` float32 [1], the max over the experts ("the moe plugin only supports a single
    activation scaling factor for all experts", ModelOpt's `_build_stacked_linear`);
  * Qwen2-MoE's shared expert (`SharedMoE`: mlp.shared_expert is an MLP with swiglu): `mlp.shared_expert.fc`
    [up_r; gate_r] (per-tensor FP8 scales shared), `mlp.shared_expert.proj`, and `mlp.shared_expert_gate.weight`
    [1, hidden] in the model dtype, not sharded.

Other quantization formats are refused: the family table takes none for MoE families on the engine target.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.layout import MoeLayout
from pipeline.quantization.trtllm_checkpoint.linear import (
    Linear,
    column_shard,
    concat_rows,
    read_linear,
    row_shard,
    share_scalar_scales,
    trtllm_tensors,
)

MOE_QUANT_ALGOS = (None, "FP8")


def moe_mapping(config: dict[str, Any], tp: int) -> dict[str, int]:
    """The mapping keys TensorRT-LLM reads for the experts (ModelOpt 0.47's TRT export wrote them too)."""
    return {"moe_tp_size": tp, "moe_ep_size": 1} if num_experts(config) else {}


def num_experts(config: dict[str, Any]) -> int:
    return int((config.get("moe") or {}).get("num_experts") or 0)


def check_moe_quantization(config: dict[str, Any], model_type: str) -> None:
    algo = config["quantization"].get("quant_algo")
    if algo not in MOE_QUANT_ALGOS:
        raise StageError(
            f"the TensorRT-LLM converter stacks the experts of {model_type} unquantized or FP8 only, not {algo}",
            hint="quantize.algo fp8 or none (the family table refuses the others for MoE families on the engine target)",
        )
    if not num_experts(config):
        raise StageError(f"the TensorRT-LLM config of {model_type} has no moe.num_experts")


def moe_layer_tensors(
    tensors: dict[str, torch.Tensor],
    moe: MoeLayout,
    config: dict[str, Any],
    hf_layer: str,
    prefix: str,
    tp: int,
    rank: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The TensorRT-LLM tensors of the MoE block of HF layer `hf_layer` on TP rank `rank`, named under `prefix`."""
    block = f"{hf_layer}.{moe.block}"
    out = {f"{prefix}.mlp.router.weight": _unquantized(tensors, f"{block}.{moe.router}").float().contiguous()}
    fc, proj = [], []
    for expert in range(num_experts(config)):
        base = f"{block}.experts.{expert}"
        gate, up = share_scalar_scales([read_linear(tensors, f"{base}.{moe.gate}"), read_linear(tensors, f"{base}.{moe.up}")])
        fc.append(concat_rows([column_shard(up, tp, rank), column_shard(gate, tp, rank)], f"{base}.{moe.up}+{moe.gate}"))
        proj.append(row_shard(read_linear(tensors, f"{base}.{moe.down}"), tp, rank))
    out.update(_stacked(fc, f"{prefix}.mlp.fc", dtype))
    out.update(_stacked(proj, f"{prefix}.mlp.proj", dtype))
    if moe.shared_expert:
        shared = f"{block}.{moe.shared_expert}"
        gate, up = share_scalar_scales([read_linear(tensors, f"{shared}.gate_proj"), read_linear(tensors, f"{shared}.up_proj")])
        fused = concat_rows([column_shard(up, tp, rank), column_shard(gate, tp, rank)], f"{shared}.up_proj+gate_proj")
        out.update(trtllm_tensors(fused, f"{prefix}.mlp.shared_expert.fc", dtype))
        out.update(trtllm_tensors(row_shard(read_linear(tensors, f"{shared}.down_proj"), tp, rank), f"{prefix}.mlp.shared_expert.proj", dtype))
    if moe.shared_expert_gate:
        weight = _unquantized(tensors, f"{block}.{moe.shared_expert_gate}")
        out[f"{prefix}.mlp.shared_expert_gate.weight"] = weight.to(dtype).contiguous()
    return out


def _unquantized(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    linear = read_linear(tensors, name)
    if linear.weight_scale is not None or not linear.weight.is_floating_point() or linear.weight.dtype == torch.float8_e4m3fn:
        raise StageError(f"unified checkpoint: {name} is quantized; TensorRT-LLM runs it unquantized (ModelOpt excludes it)")
    if linear.bias is not None:
        raise StageError(f"unified checkpoint: {name} has a bias, which TensorRT-LLM's router has not")
    return linear.weight


def _stacked(experts: list[Linear], prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One [E, out, in] weight; FP8: per-expert weight scales (E, 1), one activation scale [1] (the max)."""
    first = experts[0]
    if any(lin.bias is not None for lin in experts):
        raise StageError(f"unified checkpoint: {first.name}: MoE experts with a bias are not converted")
    if any(lin.pre_quant_scale is not None or lin.weight_scale_2 is not None for lin in experts):
        raise StageError(f"unified checkpoint: {first.name}: only unquantized and FP8 experts are converted")
    weight = torch.stack([lin.weight for lin in experts])
    if weight.dtype != torch.float8_e4m3fn:
        if any(lin.weight_scale is not None for lin in experts):
            raise StageError(f"unified checkpoint: {first.name}: only unquantized and FP8 experts are converted")
        return {f"{prefix}.weight": weight.to(dtype).contiguous()}
    scales = [lin.weight_scale for lin in experts]
    inputs = [lin.input_scale for lin in experts]
    if any(s is None or s.numel() != 1 for s in scales) or any(s is None or s.numel() != 1 for s in inputs):
        raise StageError(f"unified checkpoint: {first.name}: FP8 experts need per-tensor weight and input scales")
    return {
        f"{prefix}.weight": weight.contiguous(),
        f"{prefix}.weights_scaling_factor": torch.stack([s.reshape(1).float() for s in scales if s is not None]).contiguous(),
        f"{prefix}.activation_scaling_factor": torch.stack([s.reshape(()).float() for s in inputs if s is not None]).max().reshape(1),
    }

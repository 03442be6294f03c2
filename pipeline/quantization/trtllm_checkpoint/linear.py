"""One quantized Linear of ModelOpt's unified Hugging Face checkpoint, and how it becomes TensorRT-LLM tensors.

A unified checkpoint stores, per Linear `<m>` (as ModelOpt 0.47's `export_hf_checkpoint` writes it): `<m>.weight` (FP8 E4M3, INT8, INT4 packed two
rows per byte as uint8 [out/2, in], or 16-bit), `<m>.bias`, `<m>.weight_scale` (scalar FP8; [out] INT8; [out, in/g]
INT4), `<m>.input_scale` (scalar), `<m>.weight_scale_2` (W4A8's FP8 scalar) and `<m>.pre_quant_scale` ([in], AWQ and
SmoothQuant). ModelOpt 0.47's TensorRT-LLM export writes the same values under other names
(`model_config_export.torch_to_tensorrt_llm_checkpoint` → `postprocess_tensors`): weights_scaling_factor,
activation_scaling_factor, weights_scaling_factor_2, prequant_scaling_factor, with scalars as [1] and INT4 codes
viewed as int8.

TP sharding follows ModelOpt's `postprocess._split_model_config_for_tp`: column-parallel splits weight, bias and
non-scalar weight scales on dim 0 (pre-quant scale replicated); row-parallel splits the weight on dim 1, a group-wise
weight scale on dim 1 and the pre-quant scale on dim 0 (bias and per-channel scales replicated).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import overload

import torch

from pipeline.errors import StageError

FP8 = torch.float8_e4m3fn
# unified name -> TensorRT-LLM name, for the tensors that only change their name
_SCALE_NAMES = {
    "weight_scale": "weights_scaling_factor",
    "input_scale": "activation_scaling_factor",
    "weight_scale_2": "weights_scaling_factor_2",
    "pre_quant_scale": "prequant_scaling_factor",
}
SUFFIXES = ("weight", "bias", *_SCALE_NAMES)


@dataclass(frozen=True)
class Linear:
    """The tensors of one Linear, in the unified checkpoint's meaning. `name` says where it came from (errors)."""

    name: str
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    weight_scale: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None
    weight_scale_2: torch.Tensor | None = None
    pre_quant_scale: torch.Tensor | None = None

    @property
    def packed_int4(self) -> bool:
        """INT4 codes two output rows per byte: the weight has half the rows its scale has."""
        return (
            self.weight.dtype in (torch.uint8, torch.int8)
            and self.weight_scale is not None
            and (self.weight_scale.dim() == 2 and self.weight_scale.shape[0] == 2 * self.weight.shape[0])
        )

    @property
    def out_features(self) -> int:
        return self.weight.shape[0] * (2 if self.packed_int4 else 1)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name" and getattr(self, f.name) is not None}


def read_linear(tensors: dict[str, torch.Tensor], name: str) -> Linear:
    """The Linear `name` (without suffix); StageError naming the tensor when its weight is absent."""
    if f"{name}.weight" not in tensors:
        raise StageError(f"unified checkpoint: tensor {name}.weight is missing")
    return Linear(name, tensors[f"{name}.weight"], **{s: tensors.get(f"{name}.{s}") for s in SUFFIXES if s != "weight"})


@overload
def _rows(tensor: torch.Tensor, start: int, stop: int, out_features: int) -> torch.Tensor: ...
@overload
def _rows(tensor: None, start: int, stop: int, out_features: int) -> None: ...
@overload
def _rows(tensor: torch.Tensor | None, start: int, stop: int, out_features: int) -> torch.Tensor | None: ...
def _rows(tensor: torch.Tensor | None, start: int, stop: int, out_features: int) -> torch.Tensor | None:
    """Rows [start, stop) of a per-output-row tensor; scalars and per-input tensors pass unchanged."""
    if tensor is None or tensor.dim() == 0 or tensor.numel() == 1:
        return tensor
    if tensor.shape[0] == out_features:
        return tensor[start:stop]
    if tensor.shape[0] * 2 == out_features:  # packed INT4 rows
        return tensor[start // 2 : stop // 2]
    raise StageError(f"cannot split rows of a tensor of shape {tuple(tensor.shape)} ({out_features} output rows)")


def split_rows(linear: Linear, sizes: list[int], names: list[str]) -> list[Linear]:
    """Split a fused Linear (Phi-3 qkv_proj, gate_up_proj) along its output rows."""
    out = linear.out_features
    if sum(sizes) != out or (linear.packed_int4 and any(s % 2 for s in sizes)):
        raise StageError(f"unified checkpoint: {linear.name} has {out} output rows, cannot split into {sizes}")
    parts, start = [], 0
    for size, name in zip(sizes, names):
        stop = start + size
        parts.append(
            replace(
                linear,
                name=name,
                weight=_rows(linear.weight, start, stop, out),
                bias=_rows(linear.bias, start, stop, out),
                weight_scale=_rows(linear.weight_scale, start, stop, out),
            )
        )
        start = stop
    return parts


def concat_rows(linears: list[Linear], name: str) -> Linear:
    """Concatenate Linears with one input along their output rows; their scalar scales must already agree."""
    first = linears[0]
    for key in ("input_scale", "weight_scale_2", "pre_quant_scale"):
        values = [getattr(lin, key) for lin in linears]
        head = values[0]
        if any((v is None) != (head is None) or (v is not None and head is not None and not torch.equal(v, head)) for v in values):
            raise StageError(f"unified checkpoint: {', '.join(lin.name for lin in linears)} disagree on {key}")
    scales = [lin.weight_scale for lin in linears]
    head_scale = scales[0]
    scalar = head_scale is None or head_scale.numel() == 1
    if scalar and any(s is not None and (head_scale is None or not torch.equal(s, head_scale)) for s in scales):
        raise StageError(f"unified checkpoint: {', '.join(lin.name for lin in linears)} disagree on weight_scale")
    row_scales = [s for s in scales if s is not None]
    if not scalar and len(row_scales) != len(scales):
        raise StageError(f"unified checkpoint: {', '.join(lin.name for lin in linears)}: some have a per-row weight_scale, some none")
    biases = [lin.bias for lin in linears if lin.bias is not None]
    if len(biases) not in (0, len(linears)):
        raise StageError(f"unified checkpoint: {', '.join(lin.name for lin in linears)}: some have a bias, some not")
    return replace(
        first,
        name=name,
        weight=torch.cat([lin.weight for lin in linears]),
        bias=torch.cat(biases) if biases else None,
        weight_scale=head_scale if scalar else torch.cat(row_scales),
    )


def share_scalar_scales(linears: list[Linear]) -> list[Linear]:
    """Give Linears that TensorRT-LLM runs as one GEMM (q/k/v, gate/up) one per-tensor scale each, as ModelOpt's TRT
    export does (`preprocess_linear_fusion` + `QKVConfig`: the max). An FP8 weight whose scale grows is re-quantized
    from its dequantized values; W4A8's FP8 second scale must already agree (the unified export fuses those)."""
    out = list(linears)
    inputs = _per_tensor([lin.input_scale for lin in out])
    if inputs is not None:
        top = torch.stack([v.reshape(()) for v in inputs]).max()
        out = [replace(lin, input_scale=top.reshape(v.shape)) for lin, v in zip(out, inputs)]
    seconds = _per_tensor([lin.weight_scale_2 for lin in out])
    if seconds is not None:
        top = torch.stack([v.reshape(()) for v in seconds]).max()
        if any(not torch.equal(v.reshape(()), top) for v in seconds):
            raise StageError(f"unified checkpoint: {', '.join(lin.name for lin in out)} disagree on weight_scale_2")
        out = [replace(lin, weight_scale_2=top.reshape(v.shape)) for lin, v in zip(out, seconds)]
    scales = _per_tensor([lin.weight_scale for lin in out])
    if scales is not None and all(lin.weight.dtype == FP8 for lin in out):
        top = torch.stack([s.reshape(()).float() for s in scales]).max()
        out = [_requantize_fp8(lin, old, top) for lin, old in zip(out, scales)]
    return out


def _per_tensor(scales: list[torch.Tensor | None]) -> list[torch.Tensor] | None:
    """`scales` when every one is a per-tensor scale (one element), else None."""
    present = [s for s in scales if s is not None and s.numel() == 1]
    return present if len(present) == len(scales) else None


def _requantize_fp8(linear: Linear, weight_scale: torch.Tensor, scale: torch.Tensor) -> Linear:
    """`linear`'s FP8 weight, quantized with its `weight_scale`, re-quantized with `scale`."""
    old = weight_scale.reshape(()).float()
    if torch.equal(old, scale):
        return linear
    weight = (linear.weight.float() * old / scale).to(FP8)
    return replace(linear, weight=weight, weight_scale=scale.reshape(weight_scale.shape))


def repeat_heads(linear: Linear, head_size: int, reps: int) -> Linear:
    """Repeat each of the KV heads `reps` times (ModelOpt's `dup_kv_weight`, when tp_size > num_key_value_heads)."""
    if linear.weight_scale is not None and linear.weight_scale.dim() == 1 and linear.weight_scale.numel() > 1:
        raise StageError(
            f"{linear.name}: per-channel scales of KV heads cannot be repeated for tp_size > num_key_value_heads "
            "(ModelOpt's TensorRT-LLM export refuses it too)"
        )
    out = linear.out_features

    def dup(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.numel() == 1:
            return tensor
        rows = head_size if tensor.shape[0] == out else head_size // 2
        return tensor.unflatten(0, (-1, rows)).repeat_interleave(reps, dim=0).flatten(0, 1)

    bias, scale = linear.bias, linear.weight_scale
    return replace(linear, weight=dup(linear.weight), bias=None if bias is None else dup(bias), weight_scale=None if scale is None else dup(scale))


def column_shard(linear: Linear, tp: int, rank: int) -> Linear:
    out = linear.out_features
    if out % tp or (linear.packed_int4 and (out // tp) % 2):
        raise StageError(f"{linear.name}: {out} output rows do not split into {tp} tensor-parallel ranks")
    size = out // tp
    return replace(
        linear,
        weight=_rows(linear.weight, rank * size, (rank + 1) * size, out),
        bias=_rows(linear.bias, rank * size, (rank + 1) * size, out),
        weight_scale=_rows(linear.weight_scale, rank * size, (rank + 1) * size, out),
    )


def row_shard(linear: Linear, tp: int, rank: int) -> Linear:
    if tp == 1:
        return linear
    in_features = linear.weight.shape[1]
    if in_features % tp:
        raise StageError(f"{linear.name}: {in_features} input columns do not split into {tp} tensor-parallel ranks")
    scale = linear.weight_scale
    if scale is not None and scale.dim() == 2:  # group-wise: [out, in / group]
        if scale.shape[1] % tp:
            raise StageError(f"{linear.name}: {scale.shape[1]} weight-scale groups do not split into {tp} ranks")
        scale = scale.chunk(tp, dim=1)[rank]
    pre = linear.pre_quant_scale
    return replace(
        linear,
        weight=linear.weight.chunk(tp, dim=1)[rank],
        weight_scale=scale,
        pre_quant_scale=None if pre is None else pre.chunk(tp, dim=0)[rank],
    )


def trtllm_tensors(linear: Linear, prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The TensorRT-LLM names and dtypes of one (sharded) Linear, as ModelOpt 0.47 writes them."""
    result: dict[str, torch.Tensor] = {}
    for key, tensor in linear.tensors().items():
        if key == "weight":
            if tensor.dtype == torch.uint8:  # INT4 codes: TensorRT-LLM 1.x reads them as int8
                tensor = tensor.view(torch.int8)
            elif tensor.is_floating_point() and tensor.dtype != FP8:
                tensor = tensor.to(dtype)
        elif key == "bias":
            tensor = tensor.to(dtype)
        elif key == "pre_quant_scale":
            tensor = tensor.to(dtype)
        elif tensor.dim() == 0:
            tensor = tensor.reshape(1)
        result[f"{prefix}.{_SCALE_NAMES.get(key, key)}"] = tensor.contiguous()
    return result

"""Quantized Linear layers: one class per TensorRT-LLM `quant_algo`, built from a checkpoint.

Tensor names and layouts are those of ModelOpt 0.47's TensorRT-LLM export (modelopt/torch/export in nvidia-modelopt 0.47.0),
next to each Linear's `.weight`. The numerics follow what TensorRT-LLM does with them
(`tensorrt_llm.models.modeling_utils.preprocess_weights`, NVIDIA/TensorRT-LLM 1.2 line):

| quant_algo | weight | activation | output |
|---|---|---|---|
| FP8 | float8_e4m3fn, per-tensor `weights_scaling_factor` s_w | fp8(x / s_x), per-tensor `activation_scaling_factor` | (x_q · W_qᵀ) × s_x·s_w |
| W8A16 | fp16 in the file; int8 per output channel at load (as trtllm-build) | unquantized | x · (W_q × s)ᵀ |
| W8A8_SQ_PER_CHANNEL | int8, per-channel `weights_scaling_factor` [out] | int8(x ⊙ `prequant_scaling_factor` / s_x) | (x_q · W_qᵀ) × s_x·s_w[out] |
| W4A16_AWQ | packed int4 [out/2, in], `weights_scaling_factor` [out, in/group] | x ⊙ `prequant_scaling_factor` | x · (W_q × s_g)ᵀ |
| W4A8_AWQ | packed int4; fp8(W_q × s_g / `weights_scaling_factor_2`) | fp8(x ⊙ prequant / s_x) | (x_q · W8ᵀ) × alpha, alpha = s_x · s_w2 |

Products of codes accumulate in float32 and the scales are applied afterwards, as in the GEMM
epilogue; outputs come back in the input's dtype. Where TensorRT-LLM stores a derived scale in
the model dtype (AWQ block scales, W8A16 channel scales, W4A8's s_g / s_w2 in float16 and
prequant / s_x) it is rounded the same way here. Shared scales: ModelOpt's export already gives
the fused qkv (and, for FP8, fc/gate) one weight / activation scale (the maximum of the parts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from refengine.checkpoint import TensorStore
from refengine.errors import ModelLoadError
from refengine.model_config import QuantizationConfig
from refengine.model_runner.kv_quant import check_kv_cache_quant_algo
from refengine.model_runner.quant_ops import (
    expand_group_scales,
    quantize_fp8,
    quantize_int8,
    quantize_weight_per_channel,
    unpack_int4,
)

if TYPE_CHECKING:
    from refengine.model_runner.linear import Linear

FP8_CODES = (torch.float8_e4m3fn, torch.int8)  # TensorRT-LLM also accepts fp8 bytes stored as int8
INT4_PACKED = (torch.int8, torch.uint8)


@dataclass(frozen=True)
class QuantizedLinearSpec:
    """Where the Linear lives, its shape, and the checkpoint-wide settings it needs."""

    prefix: str
    in_features: int
    out_features: int
    quantization: QuantizationConfig
    checkpoint_dtype: torch.dtype  # the dtype of the unquantized tensors (config.json `dtype`)


def _finish(y: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(dtype)


class Fp8Linear:
    """FP8 per-tensor weights and activations (quant_algo FP8)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.view(torch.float8_e4m3fn)  # [out, in] codes
        self.weight_scale = weight_scale
        self.input_scale = input_scale
        self.bias = bias
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x_codes = quantize_fp8(x, self.input_scale)
        y = F.linear(x_codes.to(torch.float32), self.weight.to(torch.float32))
        return _finish(y * (self.input_scale * self.weight_scale), self.bias, x.dtype)


class WeightOnlyInt8Linear:
    """INT8 per-channel weights, unquantized activations (quant_algo W8A16)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = codes  # [out, in] int8
        self.scale = scale  # [out], in the checkpoint dtype
        self.bias = bias
        self.out_features, self.in_features = codes.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(torch.float32) * self.scale.to(torch.float32)[:, None]
        return _finish(F.linear(x.to(torch.float32), weight), self.bias, x.dtype)


class SmoothQuantLinear:
    """INT8 per-channel weights, per-tensor INT8 activations after smoothing (W8A8_SQ_PER_CHANNEL)."""

    def __init__(
        self, codes: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor, smoother: torch.Tensor | None, bias: torch.Tensor | None
    ) -> None:
        self.weight = codes  # [out, in] int8
        self.weight_scale = weight_scale  # [out] float32
        self.input_scale = input_scale  # scalar float32
        self.smoother = smoother  # [in]: ModelOpt's pre_quant_scale, multiplied into the input
        self.bias = bias
        self.out_features, self.in_features = codes.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        if self.smoother is not None:
            x32 = x32 * self.smoother.to(torch.float32)
        x_codes = quantize_int8(x32, self.input_scale)
        y = F.linear(x_codes.to(torch.float32), self.weight.to(torch.float32))
        return _finish(y * (self.input_scale * self.weight_scale), self.bias, x.dtype)


class Int4AwqLinear:
    """Group-wise INT4 weights with AWQ's pre-quant scale, unquantized activations (W4A16_AWQ)."""

    def __init__(self, codes: torch.Tensor, group_scales: torch.Tensor, group_size: int, prequant: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        self.weight = codes  # [out, in] int8 holding -8..7
        self.group_scales = group_scales  # [out, in / group], in the checkpoint dtype
        self.group_size = group_size
        self.prequant = prequant  # [in]
        self.bias = bias
        self.out_features, self.in_features = codes.shape

    def dequantized_weight(self) -> torch.Tensor:
        scales = expand_group_scales(self.group_scales.to(torch.float32), self.group_size)
        return self.weight.to(torch.float32) * scales

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        if self.prequant is not None:
            x32 = x32 * self.prequant.to(torch.float32)
        return _finish(F.linear(x32, self.dequantized_weight()), self.bias, x.dtype)


class W4A8AwqLinear:
    """Group-wise INT4 weights dequantized to FP8, FP8 activations (W4A8_AWQ)."""

    def __init__(
        self,
        codes: torch.Tensor,
        fp8_group_scales: torch.Tensor,
        group_size: int,
        input_multiplier: torch.Tensor,
        alpha: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> None:
        self.weight = codes  # [out, in] int8 holding -8..7
        self.fp8_group_scales = fp8_group_scales  # s_g / s_w2 in float16, [out, in / group]
        self.group_size = group_size
        scales = expand_group_scales(fp8_group_scales.to(torch.float32), group_size)
        # The kernel's operand: each int4 code times its group scale, rounded to fp8 (|.| <= 448).
        self.fp8_weight = quantize_fp8(codes.to(torch.float32) * scales, 1.0)
        self.input_multiplier = input_multiplier  # prequant / s_x, [in], in the checkpoint dtype
        self.alpha = alpha  # s_x * s_w2
        self.bias = bias
        self.out_features, self.in_features = codes.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x_codes = quantize_fp8(x.to(torch.float32) * self.input_multiplier.to(torch.float32), 1.0)
        y = F.linear(x_codes.to(torch.float32), self.fp8_weight.to(torch.float32))
        return _finish(y * self.alpha, self.bias, x.dtype)


# -- loaders -----------------------------------------------------------------------------------
def _load_fp8(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> Fp8Linear:
    p = spec.prefix
    weight = store.get_quantized(f"{p}.weight", (spec.out_features, spec.in_features), FP8_CODES)
    return Fp8Linear(
        weight,
        _positive(store.get_scalar(f"{p}.weights_scaling_factor"), f"{p}.weights_scaling_factor"),
        _positive(store.get_scalar(f"{p}.activation_scaling_factor"), f"{p}.activation_scaling_factor"),
        bias,
    )


def _load_w8a16(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> WeightOnlyInt8Linear:
    # Exported unquantized with quant_algo W8A16 (as TRT-LLM's quantize.py does for int8_wo); trtllm-build quantizes.
    if store.has(f"{spec.prefix}.per_channel_scale"):
        raise ModelLoadError(
            f"{spec.prefix}: W8A16 weights pre-quantized by convert_checkpoint (--use_weight_only, "
            "per_channel_scale) are not supported; export the unquantized weights (quantize.py int8_wo)"
        )
    weight = store.get(f"{spec.prefix}.weight", (spec.out_features, spec.in_features))
    codes, scale = quantize_weight_per_channel(weight, bits=8, scale_dtype=spec.checkpoint_dtype)
    return WeightOnlyInt8Linear(codes, scale, bias)


def _load_sq(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> SmoothQuantLinear:
    p, out_f, in_f = spec.prefix, spec.out_features, spec.in_features
    codes = store.get_quantized(f"{p}.weight", (out_f, in_f), (torch.int8,))
    weight_scale = store.get(f"{p}.weights_scaling_factor", (out_f,)).to(torch.float32)
    _positive(weight_scale, f"{p}.weights_scaling_factor")
    input_scale = _positive(store.get_scalar(f"{p}.activation_scaling_factor"), f"{p}.activation_scaling_factor")
    smoother = store.get_optional(f"{p}.prequant_scaling_factor", (in_f,))
    return SmoothQuantLinear(codes, weight_scale, input_scale, smoother, bias)


def _int4_parts(store: TensorStore, spec: QuantizedLinearSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    p, out_f, in_f = spec.prefix, spec.out_features, spec.in_features
    group = spec.quantization.group_size
    if out_f % 2 or in_f % group:
        raise ModelLoadError(f"{p}: INT4 needs an even out_features and in_features divisible by group_size {group} (got out {out_f}, in {in_f})")
    packed = store.get_quantized(f"{p}.weight", (out_f // 2, in_f), INT4_PACKED)
    scales = store.get(f"{p}.weights_scaling_factor", (out_f, in_f // group))
    _positive(scales, f"{p}.weights_scaling_factor")
    prequant = None
    if spec.quantization.pre_quant_scale:
        prequant = store.get(f"{p}.prequant_scaling_factor", (in_f,))
    return unpack_int4(packed), scales, prequant


def _load_w4a16_awq(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> Int4AwqLinear:
    codes, scales, prequant = _int4_parts(store, spec)
    return Int4AwqLinear(codes, scales.to(spec.checkpoint_dtype), spec.quantization.group_size, prequant, bias)


def _load_w4a8_awq(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> W4A8AwqLinear:
    p = spec.prefix
    codes, scales, prequant = _int4_parts(store, spec)
    weight_scale_2 = _positive(store.get_scalar(f"{p}.weights_scaling_factor_2"), f"{p}.weights_scaling_factor_2")
    input_scale = _positive(store.get_scalar(f"{p}.activation_scaling_factor"), f"{p}.activation_scaling_factor")
    if prequant is None:
        prequant = torch.ones(spec.in_features)
    # As TensorRT-LLM's preprocess_weights: scale / scale_2 in float16, prequant / act in model dtype.
    fp8_group_scales = (scales.to(torch.float32) / weight_scale_2).to(torch.float16)
    multiplier = (prequant.to(torch.float32) / input_scale).to(spec.checkpoint_dtype)
    return W4A8AwqLinear(codes, fp8_group_scales, spec.quantization.group_size, multiplier, input_scale * weight_scale_2, bias)


_LOADERS: MappingProxyType[str, Callable[[TensorStore, QuantizedLinearSpec, torch.Tensor | None], Linear]] = MappingProxyType(
    {
        "FP8": _load_fp8,
        "W8A16": _load_w8a16,
        "W8A8_SQ_PER_CHANNEL": _load_sq,
        "W4A16_AWQ": _load_w4a16_awq,
        "W4A8_AWQ": _load_w4a8_awq,
    }
)
SUPPORTED_QUANT_ALGOS = tuple(_LOADERS)


def check_quantization(quantization: QuantizationConfig) -> None:
    """Refuse, before any tensor is read, a `quantization` block the engine cannot execute."""
    algo = quantization.quant_algo
    if algo is not None and algo not in _LOADERS:
        raise ModelLoadError(
            f"quantization.quant_algo {algo!r} is not supported by the reference engine (supported: {', '.join(SUPPORTED_QUANT_ALGOS)}, or null)"
        )
    if algo in ("W4A16_AWQ", "W4A8_AWQ") and quantization.has_zero_point:
        raise ModelLoadError(f"quantization.has_zero_point is true: {algo} with zero points is not supported")
    check_kv_cache_quant_algo(quantization.kv_cache_quant_algo)


def load_quantized_linear(store: TensorStore, spec: QuantizedLinearSpec, bias: torch.Tensor | None) -> Linear:
    """The Linear at `spec.prefix` for `spec.quantization.quant_algo` (not None, not excluded)."""
    check_quantization(spec.quantization)
    algo = spec.quantization.quant_algo
    if algo is None:
        raise ValueError(f"{spec.prefix}: no quant_algo; an unquantized Linear is a DenseLinear")
    return _LOADERS[algo](store, spec, bias)


def _positive(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not bool(torch.all(torch.isfinite(tensor) & (tensor > 0))):
        raise ModelLoadError(f"tensor {name!r} must hold positive finite scales")
    return tensor

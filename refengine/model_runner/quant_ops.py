"""Quantize / dequantize primitives with TensorRT-LLM's rounding and saturation.

- FP8 (e4m3): `x / scale`, saturated to ±448 (TensorRT-LLM's FP8 casts are SATFINITE), cast to
  `torch.float8_e4m3fn` (round to nearest even).
- INT8 activations / KV cache: `x / scale`, rounded to nearest even (CUDA `cvt.rni.sat.s8`),
  saturated to [-128, 127].
- INT8 / INT4 weights quantized at load (W8A16): TensorRT-LLM's `symmetric_quantize` (C++):
  scale = max|w| of the output channel × (1/127), q = std::round(w / scale) (half away from zero),
  clipped to [-128, 127]; the dequantization scale is kept in the checkpoint dtype.
- INT4 packing (ModelOpt 0.47 `pack_int4_in_uint8`, modelopt/torch/export/quant_utils.py): byte[o // 2, i] holds
  row 2k in its low nibble and row 2k + 1 in its high nibble, signed (-8..7).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
INT8_MIN, INT8_MAX = -128.0, 127.0


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """float8_e4m3fn codes of `x / scale` (per-tensor or broadcastable `scale`)."""
    return (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quantize_int8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """int8 codes of `x / scale`: round half to even, saturate to [-128, 127]."""
    return torch.round(x.to(torch.float32) / scale).clamp(INT8_MIN, INT8_MAX).to(torch.int8)


def round_half_away_from_zero(x: torch.Tensor) -> torch.Tensor:
    """C's `round()`, which TensorRT-LLM's weight-only preprocessor uses (torch.round is half-even)."""
    rounded = torch.round(x)
    tie = (x - torch.trunc(x)).abs() == 0.5
    return torch.where(tie, torch.trunc(x) + torch.sign(x), rounded)


def quantize_weight_per_channel(weight: torch.Tensor, bits: int, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel weight quantization as trtllm-build does it for W8A16.

    weight [out, in] -> (codes [out, in] int8, dequantization scale [out] in `scale_dtype`).
    """
    max_code = 2.0 ** (bits - 1) - 1.0
    weight32 = weight.to(torch.float32)
    scale = weight32.abs().amax(dim=1) * (1.0 / max_code)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays 0
    codes = round_half_away_from_zero(weight32 / safe[:, None]).clamp(-max_code - 1.0, max_code)
    return codes.to(torch.int8), scale.to(scale_dtype)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Packed int4 [out / 2, in] (int8 or uint8 bytes) -> signed codes [out, in] int8."""
    data = packed.view(torch.int8)
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(data, 4), 4)  # sign-extends (int8 shift)
    high = torch.bitwise_right_shift(data, 4)
    half_out, in_features = data.shape
    return torch.stack((low, high), dim=1).reshape(2 * half_out, in_features)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of `unpack_int4`: signed codes [out, in] (-8..7) -> int8 bytes [out / 2, in]."""
    pairs = codes.to(torch.int8).reshape(-1, 2, codes.shape[1])
    low = torch.bitwise_and(pairs[:, 0], 0x0F)
    high = torch.bitwise_left_shift(pairs[:, 1], 4)
    return torch.bitwise_or(low, high)


def expand_group_scales(scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Block scales [out, in / group] -> one scale per weight element [out, in]."""
    return scales.repeat_interleave(group_size, dim=1)

"""fbgemm's fp16-weight GEMM: y = x Wᵀ + b with W packed as fp16 and the products accumulated in float32.

Why: a decode step at small batch is bound by reading the weights, and this torch build's float32
GEMM is slow for few rows. Measured on the 2-core AVX2 VM (one thread, BENCHMARKS.md, issue #15):
[1, 256] × [256, 768] takes 9 µs instead of 15 (float32) or 27 (widen fp16 → float32, then the
GEMM); at 5 rows, a speculative verify step, 12 µs instead of 51; [1, 256] × [256, 4096] 39 µs
instead of 88. `DenseLinear` runs on it with `fp16_gemm` (the target: `EngineConfig.fp16_weight_gemm`; the lean draft).

Only used when every weight survives the round trip float32 → fp16 → float32 unchanged (an fp16
checkpoint, the default), so the layer computes with exactly its checkpoint's weights; results
then differ from `F.linear` by summation order only. Anything else, or a torch without these
(deprecated) fbgemm entry points, stays on `F.linear` (`Fp16Gemm.of` gives None).
"""

from __future__ import annotations

import warnings

import torch


def fp16_gemm_available() -> bool:
    return hasattr(torch, "fbgemm_pack_gemm_matrix_fp16") and hasattr(torch, "fbgemm_linear_fp16_weight")


def holds_fp16_values(weight: torch.Tensor) -> bool:
    """Whether every value of `weight` is an fp16 value (so packing it as fp16 loses nothing)."""
    return weight.dtype == torch.float16 or bool(torch.equal(weight.half().to(weight.dtype), weight))


class Fp16Gemm:
    """W [out, in] packed for fbgemm's fp16-weight GEMM, with its bias (zeros when none); call with float32 x."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        with warnings.catch_warnings():  # torch warns once per process that these entry points are deprecated
            warnings.simplefilter("ignore")
            self._packed = torch.fbgemm_pack_gemm_matrix_fp16(weight.to(torch.float32).contiguous())
            self._bias = bias.to(torch.float32) if bias is not None else torch.zeros(weight.shape[0])
            torch.fbgemm_linear_fp16_weight(torch.zeros(1, weight.shape[1]), self._packed, self._bias)

    @staticmethod
    def of(weight: torch.Tensor, bias: torch.Tensor | None) -> Fp16Gemm | None:
        """The packed GEMM of `weight`, or None where it would change the weights or is unavailable."""
        return Fp16Gemm(weight, bias) if fp16_gemm_available() and holds_fp16_values(weight) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fbgemm_linear_fp16_weight(x, self._packed, self._bias)

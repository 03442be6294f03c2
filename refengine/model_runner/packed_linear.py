"""fbgemm's fp16-weight GEMM: y = x Wᵀ + b with W packed as fp16 and the products accumulated in float32.

Why: a decode step at small batch is bound by reading the weights, and this torch build's float32
GEMM is slow for few rows. Measured on the 2-core AVX2 VM (one thread, BENCHMARKS.md, issue #15):
[1, 256] × [256, 768] takes 9 µs instead of 15 (float32) or 27 (widen fp16 → float32, then the
GEMM); at 5 rows, a speculative verify step, 12 µs instead of 51; [1, 256] × [256, 4096] 39 µs
instead of 88. The target (`DenseLinear`, `EngineConfig.fp16_weight_gemm`) and the lean draft use it.

Only used when every weight survives the round trip float32 → fp16 → float32 unchanged (an fp16
checkpoint, the default), so the layer computes with exactly its checkpoint's weights; results
then differ from `F.linear` by summation order only. Anything else, or a torch without these
(deprecated) fbgemm entry points, uses `F.linear` on float32 weights.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F


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


class PackedLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, allow_fp16: bool = True) -> None:
        """`weight` [out, in] and `bias` [out] in float32."""
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features = weight.shape[0]
        self._fp16 = Fp16Gemm.of(self.weight, bias) if allow_fp16 else None

    @property
    def is_fp16(self) -> bool:
        return self._fp16 is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp16 is None:
            return F.linear(x, self.weight, self.bias)
        return self._fp16(x)

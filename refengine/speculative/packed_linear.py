"""y = x Wᵀ + b for the lean draft, on fbgemm's fp16-weight GEMM when W holds fp16 values.

Why: a draft forward at batch 1 is bound by reading its weights (BENCHMARKS.md, issue #15): the
float32 GEMM streams 4 bytes per weight and MKL's small-M kernels on this AVX2 machine run far
below peak. fbgemm's `fbgemm_linear_fp16_weight` keeps W packed as fp16 (half the bytes) and
accumulates in float32; measured on the 2-core AVX2 VM, a [1, 256] × [256, 768] product takes
22 µs instead of 49 (fp32) or 84 (widen fp16 → fp32, then GEMM), [5, 256] × [256, 4096] 222 µs
instead of 608.

Only used when every weight survives the round trip float32 → fp16 → float32 unchanged (an fp16
checkpoint, the default), so the draft computes with exactly its checkpoint's weights; results
then differ from `F.linear` by summation order only. Anything else, or a torch without these
(deprecated) fbgemm entry points, uses `F.linear` on float32 weights.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F


def fp16_gemm_available() -> bool:
    return hasattr(torch, "fbgemm_pack_gemm_matrix_fp16") and hasattr(torch, "fbgemm_linear_fp16_weight")


class PackedLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, allow_fp16: bool = True) -> None:
        """`weight` [out, in] and `bias` [out] in float32."""
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features = weight.shape[0]
        self._packed = None
        if allow_fp16 and fp16_gemm_available() and bool(torch.equal(weight.half().float(), weight)):
            with warnings.catch_warnings():  # torch warns once per process that these entry points are deprecated
                warnings.simplefilter("ignore")
                self._packed = torch.fbgemm_pack_gemm_matrix_fp16(self.weight)
                self._bias = bias if bias is not None else torch.zeros(self.out_features)
                torch.fbgemm_linear_fp16_weight(torch.zeros(1, weight.shape[1]), self._packed, self._bias)

    @property
    def is_fp16(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.fbgemm_linear_fp16_weight(x, self._packed, self._bias)

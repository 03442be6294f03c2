"""Quantized KV cache (`quantization.kv_cache_quant_algo` FP8 or INT8), as TensorRT-LLM runs it.

The paged KV tensors hold codes (`torch.float8_e4m3fn` / `torch.int8`). Each attention layer has
one dequantization scale, `transformer.layers.{i}.attention.kv_cache_scaling_factor`, shared by
K and V: TensorRT-LLM takes max(k, v) when a checkpoint has separate `k_cache_scaling_factor` /
`v_cache_scaling_factor` (ModelOpt 0.47 writes all three), and so does this loader. Keys (after
RoPE) and values are stored as `quantize(x / scale)` and read back as `code × scale`; attention
then runs in the query's dtype (float32 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

from refengine.checkpoint import TensorStore
from refengine.errors import ModelLoadError
from refengine.model_runner.quant_ops import quantize_fp8, quantize_int8

KV_CACHE_DTYPES = MappingProxyType({"FP8": torch.float8_e4m3fn, "INT8": torch.int8})
SUPPORTED_KV_CACHE_QUANT_ALGOS = tuple(KV_CACHE_DTYPES)


def check_kv_cache_quant_algo(algo: str | None) -> None:
    if algo is not None and algo not in KV_CACHE_DTYPES:
        raise ModelLoadError(
            f"quantization.kv_cache_quant_algo {algo!r} is not supported by the reference engine "
            f"(supported: {', '.join(SUPPORTED_KV_CACHE_QUANT_ALGOS)}, or null)"
        )


def kv_cache_dtype(algo: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the paged KV tensors: the codes' dtype when quantized, else the model's."""
    check_kv_cache_quant_algo(algo)
    return model_dtype if algo is None else KV_CACHE_DTYPES[algo]


@dataclass(frozen=True)
class KVCacheQuantizer:
    """One layer's K/V quantization: codes of `x / scale` in `storage_dtype`."""

    algo: str
    scale: torch.Tensor  # float32 scalar: the dequantization scale (kv_cache_scaling_factor)

    @property
    def storage_dtype(self) -> torch.dtype:
        return KV_CACHE_DTYPES[self.algo]

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        if self.algo == "FP8":
            return quantize_fp8(x, self.scale)
        return quantize_int8(x, self.scale)

    def dequantize(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (codes.to(torch.float32) * self.scale).to(dtype)


def load_kv_cache_quantizer(store: TensorStore, attention_prefix: str, algo: str | None) -> KVCacheQuantizer | None:
    """The quantizer of one attention layer (`attention_prefix` = "transformer.layers.{i}.attention")."""
    check_kv_cache_quant_algo(algo)
    if algo is None:
        return None
    names = [f"{attention_prefix}.{kind}_cache_scaling_factor" for kind in ("k", "v")]
    if all(store.has(name) for name in names):
        scale = torch.maximum(*(store.get_scalar(name) for name in names))
    else:
        scale = store.get_scalar(f"{attention_prefix}.kv_cache_scaling_factor")
    scale = scale.to(torch.float32)
    if not (torch.isfinite(scale) and scale > 0):
        raise ModelLoadError(f"{attention_prefix}.kv_cache_scaling_factor must be positive, got {scale.item()}")
    return KVCacheQuantizer(algo, scale)

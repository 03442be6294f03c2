"""Linear layers, and the seam where each quantization format plugs in.

`load_linear` reads one TensorRT-LLM Linear (`<prefix>.weight`, optional `<prefix>.bias`, and the
format's sibling tensors) for the checkpoint's `quantization` block. Unquantized weights (no
`quant_algo`, or a Linear matched by `exclude_modules`) give a `DenseLinear`; every quantized
format is a class in `quantized_linear.py` with the same `__call__`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Protocol

import torch
import torch.nn.functional as F

from refengine.checkpoint import TensorStore
from refengine.model_config import QuantizationConfig
from refengine.model_runner.packed_linear import Fp16Gemm
from refengine.model_runner.quantized_linear import QuantizedLinearSpec, load_quantized_linear


class Linear(Protocol):
    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class LinearSpec:
    """Where a Linear lives and what shape it must have."""

    prefix: str  # e.g. "transformer.layers.0.attention.qkv"
    in_features: int
    out_features: int
    bias_required: bool = False  # False: a bias is used when present (shape-checked)


# (stored, compute) dtype pairs where every stored value converts exactly.
EXACT_WIDENINGS = frozenset({(torch.float16, torch.float32), (torch.bfloat16, torch.float32)})
# Largest widened weight worth the widening copy: it must stay in cache for the GEMM that reads it.
MAX_WIDENED_BYTES = 1 << 20


def weight_storage(weight: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """How a dense weight is kept: in its checkpoint dtype when it widens exactly to the compute
    dtype (fp16 / bf16 weights computed in float32) and its widened copy is at most
    `MAX_WIDENED_BYTES`, else converted to the compute dtype once, here."""
    widened_bytes = weight.numel() * torch.empty((), dtype=compute_dtype).element_size()
    if (weight.dtype, compute_dtype) in EXACT_WIDENINGS and widened_bytes <= MAX_WIDENED_BYTES:
        return weight.contiguous()
    return weight.to(compute_dtype)


class WeightScratch(threading.local):
    """Per-thread buffers, one per (shape, dtype), that narrow-stored weights are widened into
    right before their GEMM. A model shares one among its Linears, so the buffer stays in cache."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def widened(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`weight.to(dtype)` written into this thread's buffer of its shape: use it at once (as
        an operand); the next call for the same shape overwrites it."""
        key = (tuple(weight.shape), dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            with torch.inference_mode(False):  # a normal tensor: writable inside and outside inference mode
                buffer = torch.empty(weight.shape, dtype=dtype)
            self._buffers[key] = buffer
        return buffer.copy_(weight)


class DenseLinear:
    """y = x Wᵀ + b with W [out, in] (TensorRT-LLM stores Linear weights as (out, in)).

    With `fp16_gemm` (`EngineConfig.fp16_weight_gemm`, the default), a W whose values are all fp16
    (an fp16 checkpoint's) computed in float32 runs on fbgemm's fp16-weight GEMM (packed_linear.py):
    W packed as fp16, products accumulated in float32, so results differ from `F.linear` on the
    float32 weights by summation order only, at about half the decode step's cost. W is then kept
    as fp16 beside the packed copy (the float32 copy is not kept).

    Otherwise W may be stored narrower than the compute dtype when it widens exactly
    (`weight_storage`): fp16 checkpoint weights computed in float32 stay fp16 and are widened right
    before the GEMM (into `scratch` when given). The GEMM then sees the same float32 values as with
    a float32 copy, so results are identical, while each step streams half the weight bytes.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        compute_dtype: torch.dtype | None = None,
        scratch: WeightScratch | None = None,
        fp16_gemm: bool = False,
    ) -> None:
        self.bias = bias
        self.compute_dtype = weight.dtype if compute_dtype is None else compute_dtype
        self.scratch = scratch
        self.out_features, self.in_features = weight.shape
        self._fp16 = Fp16Gemm.of(weight, bias) if fp16_gemm and self.compute_dtype == torch.float32 else None
        self.weight = weight.half() if self._fp16 is not None and weight.dtype != torch.float16 else weight

    @property
    def uses_fp16_gemm(self) -> bool:
        return self._fp16 is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp16 is not None:
            return self._fp16(x)
        weight = self.weight
        if weight.dtype != self.compute_dtype:
            if self.scratch is None:
                weight = weight.to(self.compute_dtype)
            else:
                weight = self.scratch.widened(weight, self.compute_dtype)
        return F.linear(x, weight, self.bias)


def is_excluded(prefix: str, quantization: QuantizationConfig) -> bool:
    """Whether `exclude_modules` (fnmatch patterns on TensorRT-LLM module names) keeps it unquantized."""
    return any(fnmatchcase(prefix, pattern) for pattern in quantization.exclude_modules)


def load_linear(
    store: TensorStore,
    spec: LinearSpec,
    quantization: QuantizationConfig,
    dtype: torch.dtype,
    checkpoint_dtype: torch.dtype = torch.float16,
    scratch: WeightScratch | None = None,
    fp16_gemm: bool = False,
) -> Linear:
    """The Linear at `spec.prefix`; `dtype` is the compute dtype, `checkpoint_dtype` config.json's.
    `scratch`: where a dense weight kept in a narrower dtype is widened; `fp16_gemm`: fbgemm's
    fp16-weight GEMM for fp16 values (see `DenseLinear`)."""
    if quantization.quant_algo is None or is_excluded(spec.prefix, quantization):
        weight = store.get(f"{spec.prefix}.weight", (spec.out_features, spec.in_features))
        return DenseLinear(weight_storage(weight, dtype), _load_bias(store, spec, dtype), dtype, scratch, fp16_gemm)
    quantized_spec = QuantizedLinearSpec(spec.prefix, spec.in_features, spec.out_features, quantization, checkpoint_dtype)
    return load_quantized_linear(store, quantized_spec, _load_bias(store, spec, dtype))


def _load_bias(store: TensorStore, spec: LinearSpec, dtype: torch.dtype) -> torch.Tensor | None:
    bias_name = f"{spec.prefix}.bias"
    bias: torch.Tensor | None
    if spec.bias_required:
        bias = store.get(bias_name, (spec.out_features,))
    else:
        bias = store.get_optional(bias_name, (spec.out_features,))
    return None if bias is None else bias.to(dtype)

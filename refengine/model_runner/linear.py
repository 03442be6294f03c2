"""Linear layers, and the seam where each quantization format plugs in.

`load_linear` reads one TensorRT-LLM Linear (`<prefix>.weight`, optional `<prefix>.bias`, and the
format's sibling tensors) for the checkpoint's `quantization` block. Unquantized weights (no
`quant_algo`, or a Linear matched by `exclude_modules`) give a `DenseLinear`; every quantized
format is a class in `quantized_linear.py` with the same `__call__`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Protocol

import torch
import torch.nn.functional as F

from refengine.checkpoint import TensorStore
from refengine.model_config import QuantizationConfig
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


class DenseLinear:
    """y = x Wᵀ + b with W [out, in] (TensorRT-LLM stores Linear weights as (out, in))."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def is_excluded(prefix: str, quantization: QuantizationConfig) -> bool:
    """Whether `exclude_modules` (fnmatch patterns on TensorRT-LLM module names) keeps it unquantized."""
    return any(fnmatchcase(prefix, pattern) for pattern in quantization.exclude_modules)


def load_linear(
    store: TensorStore,
    spec: LinearSpec,
    quantization: QuantizationConfig,
    dtype: torch.dtype,
    checkpoint_dtype: torch.dtype = torch.float16,
) -> Linear:
    """The Linear at `spec.prefix`; `dtype` is the compute dtype, `checkpoint_dtype` config.json's."""
    if quantization.quant_algo is None or is_excluded(spec.prefix, quantization):
        weight = store.get(f"{spec.prefix}.weight", (spec.out_features, spec.in_features))
        return DenseLinear(weight.to(dtype), _load_bias(store, spec, dtype))
    quantized_spec = QuantizedLinearSpec(
        spec.prefix, spec.in_features, spec.out_features, quantization, checkpoint_dtype
    )
    return load_quantized_linear(store, quantized_spec, _load_bias(store, spec, dtype))


def _load_bias(store: TensorStore, spec: LinearSpec, dtype: torch.dtype) -> torch.Tensor | None:
    bias_name = f"{spec.prefix}.bias"
    if spec.bias_required:
        bias = store.get(bias_name, (spec.out_features,))
    else:
        bias = store.get_optional(bias_name, (spec.out_features,))
    return None if bias is None else bias.to(dtype)

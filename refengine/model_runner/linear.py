"""Linear layers and the seam where a quantized format will plug in.

`load_linear` reads one TensorRT-LLM Linear (`<prefix>.weight`, optional `<prefix>.bias`) for
the checkpoint's `quant_algo`. Only unquantized weights exist today; each quantized format
(FP8, INT8 SmoothQuant, INT4 AWQ, ...) will be a class with the same `__call__`, built here
from its own sibling tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from refengine.checkpoint import TensorStore
from refengine.errors import ModelLoadError


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


def load_linear(store: TensorStore, spec: LinearSpec, quant_algo: str | None, dtype: torch.dtype) -> Linear:
    if quant_algo is not None:
        raise ModelLoadError(
            f"quantization.quant_algo {quant_algo!r} is not supported yet by the reference engine "
            f"(needed for {spec.prefix})"
        )
    weight = store.get(f"{spec.prefix}.weight", (spec.out_features, spec.in_features))
    bias_name = f"{spec.prefix}.bias"
    if spec.bias_required:
        bias = store.get(bias_name, (spec.out_features,))
    else:
        bias = store.get_optional(bias_name, (spec.out_features,))
    return DenseLinear(weight.to(dtype), None if bias is None else bias.to(dtype))

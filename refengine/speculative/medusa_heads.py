"""Medusa heads: K small heads on the base model's last hidden state (after the final norm), each predicting a later
token (head h at position t: the token at t + 2 + h; the base lm_head predicts t + 1).

The file is the Medusa checkpoint layout that TensorRT-LLM's `load_medusa_hf` reads (and FasterDecoding Medusa writes),
`medusa_lm_head.safetensors`: for head h and residual layer l < L, `{h}.{l}.linear.weight` [H, H] and
`{h}.{l}.linear.bias` [H]; the head's projection `{h}.{L}.weight` [V, H] (no bias). On a hidden state x:
x_0 = x; x_{l+1} = x_l + SiLU(W_l x_l + b_l); logits_h = W_lm x_L.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from refengine.errors import EngineConfigError
from refengine.model_runner.linear import DenseLinear, weight_storage

HEADS_FILE = "medusa_lm_head.safetensors"


class MedusaHeads:
    """`fp16_gemm`: fp16 weights computed in float32 run on the target's fp16-weight GEMM (model_runner/linear.py's
    DenseLinear, `EngineConfig.fp16_weight_gemm`): the heads cost about as much as the target's own layers per row."""

    def __init__(
        self, residual_layers: list[list[tuple[torch.Tensor, torch.Tensor]]], projections: list[torch.Tensor],
        dtype: torch.dtype = torch.float32, fp16_gemm: bool = False,
    ) -> None:
        self.dtype = dtype
        self.residual_layers = [  # [head][layer]: W x + b
            [DenseLinear(weight, bias.to(dtype), dtype, None, fp16_gemm) for weight, bias in layers] for layers in residual_layers
        ]
        self.projections = [DenseLinear(weight, None, dtype, None, fp16_gemm) for weight in projections]  # [head]: [V, H]

    @property
    def num_heads(self) -> int:
        return len(self.projections)

    @classmethod
    def load(
        cls, path: Path, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int, dtype: torch.dtype, field: str,
        fp16_gemm: bool = False,
    ) -> MedusaHeads:
        """The heads of `path` in the compute dtype; a missing tensor or one whose size disagrees with the model
        (hidden size, vocabulary) is an `EngineConfigError` naming `field`, the tensor and both sizes."""
        from safetensors.torch import load_file

        if not path.is_file():
            raise EngineConfigError(field, f"{path} does not exist (the Medusa heads, {HEADS_FILE})")
        tensors = load_file(str(path))

        def get(name: str, shape: tuple[int, ...], what: str) -> torch.Tensor:
            tensor = tensors.get(name)
            if tensor is None:
                raise EngineConfigError(field, f"{path.name} has no tensor {name!r} ({num_heads} heads of {num_layers} layers expected)")
            if tuple(tensor.shape) != shape:
                raise EngineConfigError(field, f"{name} has shape {list(tensor.shape)}, the model needs {list(shape)} ({what})")
            return weight_storage(tensor, dtype)

        hidden_what = f"hidden size {tensors_hidden(tensors)} vs the model's {hidden_size}"
        layers = [
            [(get(f"{h}.{layer}.linear.weight", (hidden_size, hidden_size), hidden_what), get(f"{h}.{layer}.linear.bias", (hidden_size,), hidden_what))
             for layer in range(num_layers)]
            for h in range(num_heads)
        ]
        vocab_what = f"vocab size {tensors_vocab(tensors, num_layers)} vs the model's {vocab_size}, hidden size vs {hidden_size}"
        projections = [get(f"{h}.{num_layers}.weight", (vocab_size, hidden_size), vocab_what) for h in range(num_heads)]
        return cls(layers, projections, dtype, fp16_gemm)

    def top_tokens(self, hidden: torch.Tensor, top_k: Sequence[int]) -> list[list[list[int]]]:
        """hidden [B, H] -> [row][head h] the top_k[h] most likely token ids of head h, most likely first (heads beyond
        len(top_k) are not run)."""
        results: list[list[list[int]]] = [[] for _ in range(hidden.shape[0])]
        hidden = hidden.to(self.dtype)
        for head, k in enumerate(top_k):
            x = hidden
            for linear in self.residual_layers[head]:
                x = x + F.silu(linear(x))
            ids = torch.topk(self.projections[head](x), k, dim=-1).indices.tolist()
            for row, row_ids in enumerate(ids):
                results[row].append(row_ids)
        return results


def tensors_hidden(tensors: dict[str, torch.Tensor]) -> int | str:
    """The heads' hidden size as the file has it (for error messages)."""
    bias = tensors.get("0.0.linear.bias")
    return int(bias.shape[0]) if bias is not None else "?"


def tensors_vocab(tensors: dict[str, torch.Tensor], num_layers: int) -> int | str:
    projection = tensors.get(f"0.{num_layers}.weight")
    return int(projection.shape[0]) if projection is not None else "?"

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
    DenseLinear, `EngineConfig.fp16_weight_gemm`): the heads cost about as much as the target's own layers per row.

    `vocab_size` M (`refengine_speculative.medusa_vocab_size`): the heads propose only the first M token ids (their
    projections keep those rows). A head's projection [V, H] is as large as the model's lm_head, so on a model with a
    large vocabulary against its hidden size the heads' cost falls about in proportion; byte-level BPE numbers its
    frequent merges first, so acceptance falls less. Output is unchanged: the target verifies every node.

    Every head's first residual layer reads the same hidden state: the K layers run as one GEMM ([K * H, H])."""

    def __init__(
        self,
        residual_layers: list[list[tuple[torch.Tensor, torch.Tensor]]],
        projections: list[torch.Tensor],
        dtype: torch.dtype = torch.float32,
        fp16_gemm: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        self.dtype = dtype
        self.hidden_size = projections[0].shape[1]
        self.vocab_size = projections[0].shape[0] if vocab_size is None else min(vocab_size, projections[0].shape[0])
        first = [layers[0] for layers in residual_layers if layers]
        self.first_layers = (  # every head's layer 0 at once: [K * H, H]
            DenseLinear(torch.cat([w for w, _ in first]), torch.cat([b for _, b in first]).to(dtype), dtype, None, fp16_gemm)
            if len(first) == len(projections)
            else None
        )
        skip = 1 if self.first_layers is not None else 0
        self.later_layers = [  # [head][the layers after the fused ones]: W x + b
            [DenseLinear(weight, bias.to(dtype), dtype, None, fp16_gemm) for weight, bias in layers[skip:]] for layers in residual_layers
        ]
        self.projections = [  # [head]: [M, H]
            DenseLinear(weight[: self.vocab_size].contiguous(), None, dtype, None, fp16_gemm) for weight in projections
        ]

    @property
    def num_heads(self) -> int:
        return len(self.projections)

    @classmethod
    def load(
        cls,
        path: Path,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        field: str,
        fp16_gemm: bool = False,
        medusa_vocab_size: int | None = None,
    ) -> MedusaHeads:
        """The heads of `path` in the compute dtype, proposing the first `medusa_vocab_size` token ids (None: all); a
        missing tensor or one whose size disagrees with the model (hidden size, vocabulary) is an `EngineConfigError`
        naming `field`, the tensor and both sizes."""
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
            [
                (get(f"{h}.{layer}.linear.weight", (hidden_size, hidden_size), hidden_what), get(f"{h}.{layer}.linear.bias", (hidden_size,), hidden_what))
                for layer in range(num_layers)
            ]
            for h in range(num_heads)
        ]
        vocab_what = f"vocab size {tensors_vocab(tensors, num_layers)} vs the model's {vocab_size}, hidden size vs {hidden_size}"
        projections = [get(f"{h}.{num_layers}.weight", (vocab_size, hidden_size), vocab_what) for h in range(num_heads)]
        return cls(layers, projections, dtype, fp16_gemm, medusa_vocab_size)

    def top_tokens(self, hidden: torch.Tensor, top_k: Sequence[int]) -> list[list[list[int]]]:
        """hidden [B, H] -> [row][head h] the top_k[h] most likely token ids of head h, most likely first (heads beyond
        len(top_k) are not run)."""
        hidden = hidden.to(self.dtype)
        firsts = None
        if self.first_layers is not None:  # [B, K, H]: every head's x_1
            firsts = F.silu(self.first_layers(hidden)).view(hidden.shape[0], self.num_heads, self.hidden_size) + hidden.unsqueeze(1)
        indices = []
        for head, k in enumerate(top_k):
            x = hidden if firsts is None else firsts[:, head]
            for linear in self.later_layers[head]:
                x = x + F.silu(linear(x))
            indices.append(torch.topk(self.projections[head](x), k, dim=-1).indices)
        by_head = [ids.tolist() for ids in indices]
        return [[ids[row] for ids in by_head] for row in range(hidden.shape[0])]


def tensors_hidden(tensors: dict[str, torch.Tensor]) -> int | str:
    """The heads' hidden size as the file has it (for error messages)."""
    bias = tensors.get("0.0.linear.bias")
    return int(bias.shape[0]) if bias is not None else "?"


def tensors_vocab(tensors: dict[str, torch.Tensor], num_layers: int) -> int | str:
    projection = tensors.get(f"0.{num_layers}.weight")
    return int(projection.shape[0]) if projection is not None else "?"

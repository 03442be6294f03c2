"""What the model runner needs from a decoder model, and loading the one a checkpoint names.

Every architecture's model class (a row of `refengine.architectures`) implements `DecoderModel`:
it loads from a parsed TensorRT-LLM checkpoint (or CPU engine directory), says which paged KV
tensors it writes, and runs one flat token batch of a step, described by `AttentionMetadata`.
The runner, the engine and scoring see a model only through this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from refengine.architectures import architecture_for_checkpoint
from refengine.checkpoint import Checkpoint
from refengine.lora.batch import LoraBatch
from refengine.lora.modules import ModelLoraShape
from refengine.model_runner.attention import AttentionMetadata


@dataclass(frozen=True)
class KVCacheLayout:
    """The paged KV tensors a model reads and writes: one per layer, laid out as attention.py says."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype  # float8_e4m3fn / int8 codes when the checkpoint's KV cache is quantized
    # Long-RoPE: a sequence whose prompt is longer than this rotates its keys with other factors, so its cached
    # blocks must not serve a shorter prompt's prefix, nor the reverse (None: K/V depend on the tokens alone).
    long_prompt_threshold: int | None = None

    def allocate(self, num_blocks: int, tokens_per_block: int) -> list[torch.Tensor]:
        """Zeroed [2 (keys, values), num_blocks, tokens_per_block, num_kv_heads, head_size] per layer."""
        shape = (2, num_blocks, tokens_per_block, self.num_kv_heads, self.head_size)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]


class DecoderModel(Protocol):
    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, fp16_gemm: bool = False) -> DecoderModel:
        """The model with its weights in the compute `dtype` (`fp16_gemm`: fp16 values on fbgemm's fp16-weight GEMM);
        ModelLoadError naming a bad tensor or option."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def kv_cache_layout(self) -> KVCacheLayout: ...

    @property
    def lora_shape(self) -> ModelLoraShape:
        """The dimensions of the LoRA modules the model runs (refengine/lora/modules.py)."""
        ...

    def forward(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
        last_token_of: Sequence[int] | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Write the batch's K/V into `kv_caches` and return its final hidden states: [num_tokens,
        hidden], or with `last_token_of` (sequence indices) only those sequences' last tokens'.
        `lora`: the rows' adapters, whose updates are added to the Linears' outputs."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab] of final hidden states."""
        ...


def load_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, fp16_gemm: bool = False) -> DecoderModel:
    """The model class of the checkpoint's architecture, loaded from it (`fp16_gemm`: see `DenseLinear`)."""
    model_class = architecture_for_checkpoint(checkpoint.config.architecture).load_model_class()
    return model_class.from_checkpoint(checkpoint, dtype, fp16_gemm)

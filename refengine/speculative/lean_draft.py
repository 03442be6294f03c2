"""A lean decode path for a dense Llama-family draft: fewer operations per forward, optionally a smaller vocabulary.

Why (profile of one batch-1 draft-target step, BENCHMARKS.md): a draft forward of the 1-layer default draft costs
≈ 0.35 of a 4-layer target step on this CPU, because a forward through the engine's general path pays per-operation
overhead (paged block gathers, masks built per sequence, separate norms and projections) that does not shrink with
the layer count, and the 4096 × hidden lm_head is most of the draft's arithmetic. Here, for drafts only:

- each sequence owns a contiguous KV slot ([layers, 2, slots, kv_heads, max_seq_len, head_size]): attention reads a
  view, a rollback only forgets positions, and single-token steps need no mask (`scaled_dot_product_attention`);
- weights are float32 once at load, gate and up projections fused into one GEMM, fused RMSNorm;
- `vocab_size` (optional) keeps the lm_head rows of the first N token ids only: byte-level BPE numbers its merges in
  the order it learned them, most frequent first, so the first N ids cover most text (97 % of the default model's
  greedy output on held-out code is below id 1024). Tokens outside are never drafted; that costs acceptance, never
  correctness: the target verifies every draft, and a sampled draft's q is still a distribution (zero outside).

Numerics differ from the engine's path by float rounding only (fused norm, SDPA); a draft's proposals need not be
bit-identical to anything, since the target decides. `lean_draft_of` returns None for what this path does not
implement (quantized Linears, a quantized KV cache, another model class): the drafter then uses the general path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from refengine.model_runner.layers import rope_inverse_frequencies
from refengine.model_runner.linear import DenseLinear
from refengine.model_runner.llama import LlamaModel


class LeanDraft:
    def __init__(self, model: LlamaModel, num_slots: int, max_seq_len: int, vocab_size: int | None) -> None:
        config = model.config
        self.num_heads, self.num_kv_heads, self.head_size = config.num_heads, config.num_kv_heads, config.head_size
        self.hidden_size, self.epsilon = config.hidden_size, config.norm_epsilon
        self.intermediate_size = config.intermediate_size
        self.vocab_size = min(vocab_size or config.vocab_size, config.vocab_size)
        self.max_seq_len = max_seq_len

        def dense(linear: DenseLinear) -> tuple[torch.Tensor, torch.Tensor | None]:
            bias = None if linear.bias is None else linear.bias.to(torch.float32)
            return linear.weight.to(torch.float32).contiguous(), bias

        self.layers = []
        for layer in model.layers:
            fc, gate = dense(layer.fc), dense(layer.gate)
            fused_bias = None if fc[1] is None else torch.cat([fc[1], gate[1]])
            self.layers.append((
                layer.input_norm.to(torch.float32), dense(layer.qkv), dense(layer.dense), layer.post_norm.to(torch.float32),
                (torch.cat([fc[0], gate[0]]), fused_bias), dense(layer.proj),
            ))
        self.embedding = model.embedding.to(torch.float32)
        self.final_norm = model.final_norm.to(torch.float32)
        self.lm_head = model.lm_head.to(torch.float32)[: self.vocab_size].contiguous()
        inverse = rope_inverse_frequencies(config.head_size, config.rotary_base, config.rope_scaling)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos, self._sin = angles.cos(), angles.sin()
        self.cache = torch.zeros(len(self.layers), 2, num_slots, self.num_kv_heads, max_seq_len, self.head_size)

    @torch.inference_mode()
    def forward(self, feeds: Sequence[tuple[int, Sequence[int], int]]) -> torch.Tensor:
        """`feeds`: (slot, token ids, position of the first) per sequence; their K/V are written into the slot.
        Returns float32 logits [len(feeds), vocab_size] of each sequence's last token."""
        lengths = [len(tokens) for _, tokens, _ in feeds]
        ids = torch.tensor([t for _, tokens, _ in feeds for t in tokens], dtype=torch.int64)
        positions = torch.cat([torch.arange(start, start + n) for (_, _, start), n in zip(feeds, lengths)])
        heads, kv_heads, head_size = self.num_heads, self.num_kv_heads, self.head_size
        q_size, kv_size, half = heads * head_size, kv_heads * head_size, head_size // 2
        cos, sin = self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)  # [tokens, 1, head_size]
        hidden = F.embedding(ids, self.embedding)
        shape = (self.hidden_size,)
        for index, (norm1, qkv_w, dense_w, norm2, fused_w, proj_w) in enumerate(self.layers):
            qkv = F.linear(F.rms_norm(hidden, shape, norm1, self.epsilon), *qkv_w)
            query_key = qkv[:, : q_size + kv_size].reshape(-1, heads + kv_heads, head_size)
            query_key = query_key * cos + torch.cat((-query_key[..., half:], query_key[..., :half]), dim=-1) * sin
            values = qkv[:, q_size + kv_size :].reshape(-1, kv_heads, head_size)
            attention = torch.empty(ids.shape[0], heads, head_size)
            keys_cache, values_cache = self.cache[index, 0], self.cache[index, 1]
            row = 0
            for (slot, _, start), n in zip(feeds, lengths):
                end = start + n
                keys_cache[slot, :, start:end] = query_key[row : row + n, heads:].transpose(0, 1)
                values_cache[slot, :, start:end] = values[row : row + n].transpose(0, 1)
                mask = None if n == 1 else torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)
                out = F.scaled_dot_product_attention(
                    query_key[row : row + n, :heads].transpose(0, 1).unsqueeze(0), keys_cache[slot, :, :end].unsqueeze(0),
                    values_cache[slot, :, :end].unsqueeze(0), attn_mask=mask, scale=head_size**-0.5, enable_gqa=True,
                )
                attention[row : row + n] = out[0].transpose(0, 1)
                row += n
            hidden = F.linear(attention.reshape(-1, q_size), *dense_w).add_(hidden)
            gate_up = F.linear(F.rms_norm(hidden, shape, norm2, self.epsilon), *fused_w)
            inner = self.intermediate_size
            hidden = F.linear(F.silu(gate_up[:, :inner]).mul_(gate_up[:, inner:]), *proj_w).add_(hidden)
        last_rows = torch.tensor(lengths).cumsum(0) - 1
        return F.linear(F.rms_norm(hidden[last_rows], shape, self.final_norm, self.epsilon), self.lm_head)


def lean_draft_of(model: object, num_slots: int, max_seq_len: int, vocab_size: int | None) -> LeanDraft | None:
    """The lean path for a dense Llama-family model with an unquantized KV cache; None for anything else."""
    if type(model) is not LlamaModel:
        return None
    linears = [linear for layer in model.layers for linear in (layer.qkv, layer.dense, layer.fc, layer.gate, layer.proj)]
    if not all(isinstance(linear, DenseLinear) for linear in linears) or any(layer.kv_quant is not None for layer in model.layers):
        return None
    return LeanDraft(model, num_slots, max_seq_len, vocab_size)

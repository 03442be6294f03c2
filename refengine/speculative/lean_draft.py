"""A lean decode path for a dense Llama-family draft: fewer operations per forward, optionally a smaller vocabulary.

Why (profile of one batch-1 draft-target step, BENCHMARKS.md): a draft forward of the 1-layer default draft costs
≈ 0.35 of a 4-layer target step on this CPU, because a forward through the engine's general path pays per-operation
overhead (paged block gathers, masks built per sequence, separate norms and projections) that does not shrink with
the layer count, and the 4096 × hidden lm_head is most of the draft's arithmetic. Here, for drafts only:

- each sequence owns a contiguous KV slot ([layers, slots, max_seq_len, keys and values of every kv head]): a token's
  rotated key and value go in with one copy, attention reads a view, a rollback only forgets positions, and a
  single-token step needs no mask (attention is two small matmuls per kv head group, not SDPA's grouped-query path,
  which repeats K/V on the CPU);
- RoPE is one in-place complex product: the q / k rows of the qkv weight are reordered at load so that the halves
  each rotation pairs are adjacent (queries and keys alike, so q·k is unchanged);
- the Linears run on fbgemm's fp16-weight GEMM when the weights are fp16 values (`packed_linear.py`: half the weight
  bytes, a forward at batch 1 is bound by reading them), else float32 once at load; gate and up projections fused
  into one GEMM, fused RMSNorm;
- `vocab_size` (optional) keeps the lm_head rows of the first N token ids only: byte-level BPE numbers its merges in
  the order it learned them, most frequent first, so the first N ids cover most text (97 % of the default model's
  greedy output on held-out code is below id 1024). Tokens outside are never drafted; that costs acceptance, never
  correctness: the target verifies every draft, and a sampled draft's q is still a distribution (zero outside).

Numerics differ from the engine's path by float rounding only (fused norm, summation order of the GEMMs, test:
tests/refengine/test_lean_draft.py); a draft's proposals need not be
bit-identical to anything, since the target decides. `lean_draft_of` returns None for what this path does not
implement (quantized Linears, a quantized KV cache, another model class): the drafter then uses the general path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from refengine.model_runner.decoder_options import plain_options
from refengine.model_runner.layers import rope_inverse_frequencies
from refengine.model_runner.linear import DenseLinear, Linear
from refengine.model_runner.llama import LlamaModel


class LeanDraft:
    def __init__(self, model: LlamaModel, num_slots: int, max_seq_len: int, vocab_size: int | None, *, fp16_gemm: bool = True) -> None:
        """`fp16_gemm`: run the Linears on fbgemm's fp16-weight GEMM where the weights are fp16 values (DenseLinear)."""
        config = model.config
        self.num_heads, self.num_kv_heads, self.head_size = config.num_heads, config.num_kv_heads, config.head_size
        self.hidden_size, self.epsilon = config.hidden_size, config.norm_epsilon
        self.intermediate_size = config.intermediate_size
        self.vocab_size = min(vocab_size or config.vocab_size, config.vocab_size)
        self.max_seq_len = max_seq_len
        self._qk_size = (self.num_heads + self.num_kv_heads) * self.head_size
        pairs = _interleaved_halves(self.num_heads + self.num_kv_heads, self.head_size, self._qk_size + self.num_kv_heads * self.head_size)

        def weights(layer_linear: Linear | None, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
            linear = _dense(layer_linear)
            weight = linear.weight.to(torch.float32)
            bias = None if linear.bias is None else linear.bias.to(torch.float32)
            if rows is not None:
                weight, bias = weight[rows], None if bias is None else bias[rows]
            return weight, bias

        def packed(weight: torch.Tensor, bias: torch.Tensor | None) -> DenseLinear:
            return DenseLinear(weight.contiguous(), bias, torch.float32, fp16_gemm=fp16_gemm)

        self.layers = []
        for layer in model.layers:
            fc, gate = weights(layer.fc), weights(layer.gate)
            fused_bias = None if fc[1] is None else torch.cat([fc[1], _bias(gate[1])])
            self.layers.append(
                (
                    layer.input_norm.to(torch.float32),
                    packed(*weights(layer.qkv, pairs)),
                    packed(*weights(layer.dense)),
                    layer.post_norm.to(torch.float32),
                    packed(torch.cat([fc[0], gate[0]]), fused_bias),
                    packed(*weights(layer.proj)),
                )
            )
        self.embedding = model.embedding.to(torch.float32)
        self.final_norm = model.final_norm.to(torch.float32)
        self.lm_head = packed(model.lm_head.to(torch.float32)[: self.vocab_size], None)
        inverse = rope_inverse_frequencies(config.head_size, config.rotary_base, config.rope_scaling)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inverse)
        self._rotations = torch.polar(torch.ones_like(angles), angles)  # [max_seq_len, head_size / 2] complex64
        # [layers, slots, positions, K and V of every kv head]: a token's rotated key and value, as the qkv GEMM lays them
        # out, go into its slot in one copy
        self._kv_width = 2 * self.num_kv_heads * self.head_size
        self.cache = torch.zeros(len(self.layers), num_slots, max_seq_len, self._kv_width)

    @torch.inference_mode()
    def forward(self, feeds: Sequence[tuple[int, Sequence[int], int]]) -> torch.Tensor:
        """`feeds`: (slot, token ids, position of the first) per sequence; their K/V are written into the slot.
        Returns float32 logits [len(feeds), vocab_size] of each sequence's last token."""
        lengths = [len(tokens) for _, tokens, _ in feeds]
        one_each = all(n == 1 for n in lengths)  # the draft's decode steps: no mask, no row selection
        ids = torch.tensor([t for _, tokens, _ in feeds for t in tokens], dtype=torch.int64)
        heads, kv_heads, head_size = self.num_heads, self.num_kv_heads, self.head_size
        num_tokens, qk_size, q_size, kv_size = ids.shape[0], self._qk_size, heads * head_size, kv_heads * head_size
        group, scale = heads // kv_heads, head_size**-0.5
        if len(feeds) == 1:  # one sequence: its positions are consecutive
            start = feeds[0][2]
            rotations = self._rotations[start : start + num_tokens].unsqueeze(1)  # [tokens, 1, head_size / 2]
        else:
            positions = [position for (_, _, start), n in zip(feeds, lengths) for position in range(start, start + n)]
            rotations = self._rotations[torch.tensor(positions)].unsqueeze(1)
        hidden = F.embedding(ids, self.embedding)
        shape = (self.hidden_size,)
        for index, (norm1, qkv_w, dense_w, norm2, fused_w, proj_w) in enumerate(self.layers):
            qkv = qkv_w(F.rms_norm(hidden, shape, norm1, self.epsilon))
            # RoPE in place as one complex product: the q / k rows were reordered at load so that each rotated pair is adjacent
            torch.view_as_complex(qkv[:, :qk_size].reshape(num_tokens, heads + kv_heads, head_size // 2, 2)).mul_(rotations)
            cache = self.cache[index]
            outputs, row = [], 0
            for (slot, _, start), n in zip(feeds, lengths):
                end = start + n
                cache[slot, start:end] = qkv[row : row + n, q_size:]
                keys = cache[slot, :end, :kv_size].view(end, kv_heads, head_size).transpose(0, 1)  # [kv_heads, end, head_size]
                values = cache[slot, :end, kv_size:].view(end, kv_heads, head_size).transpose(0, 1)
                # the query heads grouped by the kv head they read (HF's repeat_kv order): [kv_heads, group * n, head_size]
                query = qkv[row : row + n, :q_size].reshape(n, kv_heads, group, head_size).permute(1, 2, 0, 3).reshape(kv_heads, -1, head_size)
                scores = torch.matmul(query, keys.transpose(1, 2)).mul_(scale)
                if n > 1:  # query j (position start + j) sees positions up to its own
                    future = torch.arange(end).unsqueeze(0) > torch.arange(start, end).unsqueeze(1)
                    scores.masked_fill_(future.repeat(group, 1), float("-inf"))
                out = torch.matmul(torch.softmax(scores, dim=-1), values)
                outputs.append(out.view(kv_heads, group, n, head_size).permute(2, 0, 1, 3).reshape(n, q_size))
                row += n
            attention = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
            hidden = dense_w(attention).add_(hidden)
            gate_up = fused_w(F.rms_norm(hidden, shape, norm2, self.epsilon))
            inner = self.intermediate_size
            hidden = proj_w(F.silu(gate_up[:, :inner]).mul_(gate_up[:, inner:])).add_(hidden)
        if not one_each:
            hidden = hidden[torch.tensor(lengths).cumsum(0) - 1]
        return self.lm_head(F.rms_norm(hidden, shape, self.final_norm, self.epsilon))


def _interleaved_halves(num_heads: int, head_size: int, width: int) -> torch.Tensor:
    """Row order of a qkv weight whose first `num_heads` heads (queries and keys) are reordered from rotate-half
    layout (x_0..x_{h-1}, x_h..x_{2h-1}) to pairs (x_0, x_h, x_1, x_{h+1}, ...), the values' rows left in place.
    Queries and keys move alike, so every q·k product, and attention, is unchanged."""
    half = head_size // 2
    within = torch.stack([torch.arange(half), torch.arange(half, head_size)], dim=1).reshape(-1)
    heads = (torch.arange(num_heads).unsqueeze(1) * head_size + within).reshape(-1)
    return torch.cat([heads, torch.arange(num_heads * head_size, width)])


def _dense(linear: Linear | None) -> DenseLinear:
    """A layer's Linear, which `lean_draft_of` found dense."""
    if not isinstance(linear, DenseLinear):
        raise TypeError(f"the lean draft path runs dense Linears only, not {type(linear).__name__}")
    return linear


def _bias(bias: torch.Tensor | None) -> torch.Tensor:
    """The gate's bias, present when fc has one (both follow the checkpoint's mlp_bias_required)."""
    if bias is None:
        raise TypeError("the lean draft path fuses fc and gate: fc has a bias, gate none")
    return bias


def lean_draft_of(model: object, num_slots: int, max_seq_len: int, vocab_size: int | None, *, fp16_gemm: bool = True) -> LeanDraft | None:
    """The lean path for a dense Llama-family model with an unquantized KV cache; None for anything else."""
    if type(model) is not LlamaModel or model.options != plain_options(model.config.head_size):
        return None  # another class, or a family option (q/k norm, partial / long RoPE, multipliers)
    linears = [linear for layer in model.layers for linear in (layer.qkv, layer.dense, layer.fc, layer.gate, layer.proj)]
    if not all(isinstance(linear, DenseLinear) for linear in linears) or any(layer.kv_quant is not None for layer in model.layers):
        return None
    return LeanDraft(model, num_slots, max_seq_len, vocab_size, fp16_gemm=fp16_gemm)

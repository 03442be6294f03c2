"""Paged attention over block tables, driven by an explicit `AttentionMetadata`.

The KV cache of one layer is a tensor [2, num_blocks, tokens_per_block, num_kv_heads, head_size]
(keys, values). Token t of a sequence lives in slot `block_table[t // B] * B + t % B`. A step's
queries are one flat batch of tokens (no padding): sequence i owns rows
`query_start_loc[i]:query_start_loc[i + 1]`, which are its last `query_len` tokens out of
`context_lens[i]` (tokens in the cache once this step's K/V are written).

A quantized KV cache (`kv_quant.KVCacheQuantizer`) holds codes: this step's keys/values are
quantized on the way in, and every read dequantizes to the query's dtype before attention, so a
prefill attends over the same rounded K/V that later decode steps read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from refengine.model_runner.kv_quant import KVCacheQuantizer


@dataclass(frozen=True)
class TreeRows:
    """The L query rows of a sequence verifying a tree (its last L tokens: the root, then the nodes). `blocked` [L, L]
    bool: row j may not see row k (a node sees the cached prefix, the root, its ancestors and itself, so causal order
    holds by construction); `depths` [L] int64, the root's 0: a tree row sits at root + its depth (for a window)."""

    blocked: torch.Tensor
    depths: torch.Tensor


@dataclass(frozen=True)
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64, cumulative query lengths
    context_lens: torch.Tensor  # [num_seqs] int64, cached tokens after this step's writes
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot of each query token
    positions: torch.Tensor  # [num_tokens] int64, position of each query token in its sequence
    tokens_per_block: int
    # The same figures as Python lists, read by every layer's attention (None: from the tensors).
    query_start_list: tuple[int, ...] | None = None
    context_len_list: tuple[int, ...] | None = None
    # Each sequence's prompt length, where the caller knows it (the engine's steps): long-RoPE picks its table by it.
    prompt_lens: tuple[int, ...] | None = None
    # Tree verification (Medusa): per sequence, None or its rows' mask and depths (tree_attention.py, one per tree shape).
    tree_masks: tuple[TreeRows | None, ...] | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    def query_starts(self) -> tuple[int, ...]:
        return self.query_start_list if self.query_start_list is not None else tuple(self.query_start_loc.tolist())

    def context_lengths(self) -> tuple[int, ...]:
        return self.context_len_list if self.context_len_list is not None else tuple(self.context_lens.tolist())

    def last_tokens(self, seq_indices: Sequence[int]) -> tuple[list[int], AttentionMetadata]:
        """The rows of the given sequences' last tokens, and metadata in which each of those
        sequences has just that one query token (attending over its whole context)."""
        starts, context_lens = self.query_starts(), self.context_lengths()
        rows = [starts[i + 1] - 1 for i in seq_indices]
        kept_context_lens = tuple(context_lens[i] for i in seq_indices)
        return rows, AttentionMetadata(
            query_start_loc=torch.arange(len(rows) + 1, dtype=torch.int64),
            context_lens=torch.tensor(kept_context_lens, dtype=torch.int64),
            block_tables=self.block_tables[list(seq_indices)],
            slot_mapping=self.slot_mapping[rows],
            positions=self.positions[rows],
            tokens_per_block=self.tokens_per_block,
            query_start_list=tuple(range(len(rows) + 1)),
            context_len_list=kept_context_lens,
            prompt_lens=None if self.prompt_lens is None else tuple(self.prompt_lens[i] for i in seq_indices),
        )


def build_attention_metadata(
    query_lens: Sequence[int],
    num_computed_tokens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    tokens_per_block: int,
    prompt_lens: Sequence[int] | None = None,
) -> AttentionMetadata:
    """Metadata for a flat batch: sequence i computes `query_lens[i]` tokens after
    `num_computed_tokens[i]` cached ones, stored in the blocks `block_tables[i]` (`prompt_lens[i]`: its prompt's
    length, where known)."""
    positions: list[int] = []
    slots: list[int] = []
    for query_len, start, table in zip(query_lens, num_computed_tokens, block_tables):
        end = start + query_len
        positions.extend(range(start, end))
        position = start
        while position < end:  # one run of consecutive slots per block
            index, offset = divmod(position, tokens_per_block)
            run = min(tokens_per_block - offset, end - position)
            first_slot = table[index] * tokens_per_block + offset
            slots.extend(range(first_slot, first_slot + run))
            position += run
    max_blocks = max((len(table) for table in block_tables), default=0)
    padded_tables = [list(table) + [0] * (max_blocks - len(table)) for table in block_tables]
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    context_lens = [start + length for start, length in zip(num_computed_tokens, query_lens)]
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int64),
        context_lens=torch.tensor(context_lens, dtype=torch.int64),
        block_tables=torch.tensor(padded_tables, dtype=torch.int64).reshape(len(block_tables), max_blocks),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        tokens_per_block=tokens_per_block,
        query_start_list=tuple(starts),
        context_len_list=tuple(context_lens),
        prompt_lens=None if prompt_lens is None else tuple(prompt_lens),
    )


def write_kv_cache(
    kv_cache: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_quant: KVCacheQuantizer | None = None,
) -> None:
    """Store this step's keys/values [num_tokens, num_kv_heads, head_size] in their slots."""
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    if kv_quant is not None:
        keys, values = kv_quant.quantize(keys), kv_quant.quantize(values)
    keys, values = keys.to(kv_cache.dtype), values.to(kv_cache.dtype)
    if kv_cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no float8 CPU kernel: copy the bytes
        kv_cache, keys, values = (t.view(torch.uint8) for t in (kv_cache, keys, values))
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_size)
    flat[0].index_copy_(0, slot_mapping, keys)
    flat[1].index_copy_(0, slot_mapping, values)


def gather_sequence_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [context_len, num_kv_heads, head_size] of one sequence, in order."""
    block_size = kv_cache.shape[2]
    num_blocks = -(-context_len // block_size)
    blocks = kv_cache[:, block_table[:num_blocks]]  # [2, n, B, H_kv, D]
    keys = blocks[0].reshape(-1, *blocks.shape[3:])[:context_len]
    values = blocks[1].reshape(-1, *blocks.shape[3:])[:context_len]
    return keys, values


def causal_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    tree: TreeRows | None = None,
) -> torch.Tensor:
    """Attention of the last L tokens of a sequence over all S of its tokens (GQA/MQA aware).

    query [L, H, D], keys/values [S, H_kv, D] -> [L, H, D]; query j sits at position S - L + j.
    `window` W (sliding-window layers): the query at position p attends to the keys at positions
    (p - W, p], W of them with itself, as transformers' sliding-window mask (`kv_idx > q_idx - W`).
    `softcap` c (Gemma 2): scores become c * tanh(scores / c) before the mask.
    `tree` (tree verification): the rows' mask and depths (for the window a row sits at root + depth, not at its slot).
    """
    query_len, num_heads, head_size = query.shape
    context_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    # Query head h reads key/value head h // group (Hugging Face's repeat_kv order).
    q = query.reshape(query_len, num_kv_heads, group, head_size).permute(1, 2, 0, 3)
    k = keys.permute(1, 0, 2).unsqueeze(1)
    v = values.permute(1, 0, 2).unsqueeze(1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [H_kv, G, L, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    first = context_len - query_len
    if tree is not None:  # the tree's rows among themselves; every row sees the whole cached prefix
        scores[..., first:].masked_fill_(tree.blocked, float("-inf"))
        if window is None:
            masked = None
        else:
            query_positions = (first + tree.depths).unsqueeze(1)
            key_positions = torch.cat((torch.arange(first), first + tree.depths)).unsqueeze(0)
            masked = key_positions <= query_positions - window
    else:
        query_positions = torch.arange(first, context_len).unsqueeze(1)
        key_positions = torch.arange(context_len).unsqueeze(0)
        masked = key_positions > query_positions
        if window is not None:
            masked |= key_positions <= query_positions - window
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = torch.matmul(probs, v)  # [H_kv, G, L, D]
    return out.permute(2, 0, 1, 3).reshape(query_len, num_heads, head_size)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    kv_quant: KVCacheQuantizer | None = None,
    keys: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention for a flat batch [num_tokens, H, D] whose K/V are already in `kv_cache`.

    `window` / `softcap`: a sliding-window layer's window and the scores' soft cap (`causal_attention`).

    `keys` / `values` [num_tokens, H_kv, D] (optional) are this step's K/V as written: a sequence
    whose tokens are all new this step (a whole prompt) then attends over them directly instead
    of gathering the same values back from its blocks. Only for an unquantized cache of the
    query's dtype, where the cache holds exactly these values.
    """
    output = torch.empty_like(query)
    starts = metadata.query_starts()
    tree_masks = metadata.tree_masks or ()
    fresh_kv = (keys, values) if keys is not None and values is not None and kv_quant is None and kv_cache.dtype == query.dtype else None
    for index, context_len in enumerate(metadata.context_lengths()):
        begin, end = starts[index], starts[index + 1]
        if begin == end:
            continue
        if fresh_kv is not None and end - begin == context_len:
            seq_keys, seq_values = fresh_kv[0][begin:end], fresh_kv[1][begin:end]
        else:
            seq_keys, seq_values = gather_sequence_kv(kv_cache, metadata.block_tables[index], context_len)
            if kv_quant is not None:
                seq_keys = kv_quant.dequantize(seq_keys, query.dtype)
                seq_values = kv_quant.dequantize(seq_values, query.dtype)
        tree = tree_masks[index] if index < len(tree_masks) else None
        output[begin:end] = causal_attention(query[begin:end], seq_keys, seq_values, scale, window, softcap, tree)
    return output

"""Draft-target drafting: a smaller model that shares the target's tokenizer proposes k tokens.

The draft has a paged KV cache of its own (its own block pool, the target's tokens_per_block),
kept in step with each target sequence without being told what happened to it: it remembers
which tokens its cache holds per sequence, and before proposing keeps only the longest common
prefix with the sequence's current tokens (rejected drafts, a preemption, a different
continuation all roll back the same way: `KVCacheManager.truncate`), then computes the tokens it
is missing (the accepted drafts' correction, or the whole prompt the first time) and decodes k
tokens, batched over the step's sequences: k forward passes of the draft per target step.

Greedy requests take the draft's argmax (q is then one-hot). Sampled ones draw from the draft's
own temperature / top-k / top-p distribution q, returned with the tokens for rejection sampling.
Guided requests draft under their grammar (a fork of it, advanced token by token, as NVIDIA's
draft loop advances the matcher): each row is masked before the choice, so q is the masked
distribution; drafting stops after a stop token.

A dense Llama-family draft runs on the lean path (`lean_draft.py`: one contiguous KV slot per
sequence instead of the paged cache, fewer operations per forward); `vocab_size` N keeps the draft
to the first N token ids (both paths), a cheaper lm_head at some acceptance.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from refengine.kv_cache import KVCacheManager
from refengine.model_runner import DecoderModel, build_attention_metadata
from refengine.model_runner.sampler import draw, draw_seed, sampling_probs
from refengine.speculative.lean_draft import lean_draft_of
from refengine.speculative.planner import Draft, DraftRequest


class DraftModelDrafter:
    has_draft_distribution = True  # a sampled draft carries q (Draft.probs)

    def __init__(
        self,
        model: DecoderModel,
        num_blocks: int,
        tokens_per_block: int,
        *,
        vocab_size: int | None = None,
        lean_slots: tuple[int, int] | None = None,
    ) -> None:
        """`lean_slots` (num_slots, max_seq_len): run a dense Llama draft on the lean path with that many
        contiguous KV slots (None: the paged cache of `num_blocks` blocks)."""
        self.model = model
        self._tokens_per_block = tokens_per_block
        self._vocab_size = min(vocab_size or model.vocab_size, model.vocab_size)
        self._lean = None if lean_slots is None else lean_draft_of(model, *lean_slots, self._vocab_size)
        if lean_slots is None or self._lean is None:
            self._kv = KVCacheManager(num_blocks, tokens_per_block)
            self._kv_caches = model.kv_cache_layout.allocate(num_blocks, tokens_per_block)
        else:
            self._slots: dict[int, int] = {}
            self._free_slots = list(range(lean_slots[0]))[::-1]
        self._cached: dict[int, list[int]] = {}  # seq_id -> tokens whose K/V the draft cache holds

    @property
    def is_lean(self) -> bool:
        return self._lean is not None

    def release(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            self._cached.pop(seq_id, None)
            if self._lean is None:
                self._kv.free(seq_id)
            elif seq_id in self._slots:
                self._free_slots.append(self._slots.pop(seq_id))

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest]) -> dict[int, Draft]:
        active: list[tuple[DraftRequest, list[int], int]] = []  # (request, tokens to feed, their first position)
        for request in requests:
            kept = self._roll_back(request.seq_id, request.token_ids)
            if not self._reserve(request.seq_id, len(request.token_ids) + request.num_draft_tokens - 1):
                self.release([request.seq_id])  # no room in the draft's cache: no draft this step
                continue
            active.append((request, list(request.token_ids[kept:]), kept))
        tokens: dict[int, list[int]] = {request.seq_id: [] for request, _, _ in active}
        probs: dict[int, list[torch.Tensor]] = {request.seq_id: [] for request, _, _ in active}
        while active:
            logits = self._forward(active)
            following = []
            for (request, feed, start), row in zip(active, logits):
                self._cached[request.seq_id].extend(feed)
                position = start + len(feed)
                row = row[: self._vocab_size]
                grammar = request.grammar
                if grammar is not None:
                    allowed = grammar.allowed_next()[: row.shape[0]]
                    if not bool(allowed.any()):
                        continue  # the grammar allows none of the draft's token ids: this draft ends here
                    row = row.masked_fill(~allowed, float("-inf"))
                token, q = self._choose(row, request, position)
                tokens[request.seq_id].append(token)
                if q is not None:
                    probs[request.seq_id].append(q)
                open_grammar = grammar is None or (not grammar.is_stop_token(token) and grammar.accept(token))
                if open_grammar and len(tokens[request.seq_id]) < request.num_draft_tokens:
                    following.append((request, [token], position))
            active = following
        return {seq_id: Draft(tuple(drafted), torch.stack(probs[seq_id]) if probs[seq_id] else None) for seq_id, drafted in tokens.items()}

    def _reserve(self, seq_id: int, num_tokens: int) -> bool:
        if self._lean is None:
            return self._kv.allocate_slots(seq_id, num_tokens) is not None
        if num_tokens > self._lean.max_seq_len:
            return False
        if seq_id not in self._slots:
            if not self._free_slots:
                return False
            self._slots[seq_id] = self._free_slots.pop()
        return True

    def _forward(self, active: Sequence[tuple[DraftRequest, list[int], int]]) -> torch.Tensor:
        """Logits of each active sequence's last fed token (its K/V written into the draft's cache)."""
        if self._lean is not None:
            return self._lean.forward([(self._slots[request.seq_id], feed, start) for request, feed, start in active])
        metadata = build_attention_metadata(
            [len(feed) for _, feed, _ in active],
            [start for _, _, start in active],
            [self._kv.block_table(request.seq_id) for request, _, _ in active],
            self._tokens_per_block,
        )
        input_ids = torch.tensor([t for _, feed, _ in active for t in feed], dtype=torch.int64)
        hidden = self.model.forward(input_ids, self._kv_caches, metadata, last_token_of=list(range(len(active))))
        return self.model.compute_logits(hidden)

    def _roll_back(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Keep the cached tokens that still start the sequence (at least its last token is fed)."""
        cached = self._cached.setdefault(seq_id, [])
        limit = min(len(cached), len(token_ids) - 1)
        kept = limit if list(token_ids[:limit]) == cached[:limit] else 0
        while kept < limit and cached[kept] == token_ids[kept]:
            kept += 1
        del cached[kept:]
        if self._lean is None:
            self._kv.truncate(seq_id, kept)  # a lean slot simply overwrites the positions after `kept`
        return kept

    def _choose(self, row: torch.Tensor, request: DraftRequest, position: int) -> tuple[int, torch.Tensor | None]:
        """`row`: logits of the draft's vocabulary (the first ids); a sampled draft's q covers the whole vocabulary."""
        params = request.params
        if params.is_greedy:
            return int(torch.argmax(row)), None
        q = sampling_probs(row, params)
        token = draw(q, draw_seed(request.sampling_seed, request.sample_index, position, "draft"))
        if q.shape[0] < self.model.vocab_size:
            q = torch.cat([q, q.new_zeros(self.model.vocab_size - q.shape[0])])
        return token, q

"""Turning one logits row per sampling sequence into tokens.

Order per row: logit bias → bad words → repetition / presence / frequency penalties → `min_tokens` (mask
`end_id`) → the guided-decoding grammar mask → greedy argmax, or temperature → top-k → top-p → a draw.
The grammar wins over the other processors: when they leave no allowed token (e.g. `min_tokens`
masking the only allowed `end_id`), the allowed tokens keep their raw logits. Draws use a generator
seeded from (request seed, sample index, position), so a sequence's tokens do not depend on
its batch, on preemption, or on how its prompt was chunked.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import torch

from refengine.sampling import SamplingParams
from refengine.step_messages import SampledToken, ScheduledSequence


def draw_seed(request_seed: int, sample_index: int, position: int, purpose: str = "") -> int:
    """The seed of one draw; `purpose` separates speculative decoding's other draws at a position."""
    key = f"{request_seed}:{sample_index}:{position}" + (f":{purpose}" if purpose else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def apply_logit_processors(logits: torch.Tensor, item: ScheduledSequence) -> torch.Tensor:
    """Bad words, penalties, min_tokens and the grammar mask applied to one float32 row (returns a new row)."""
    params = item.sampling_params
    raw, logits = logits, logits.clone()
    history = item.token_history
    for token_id, bias in params.logit_bias:
        logits[token_id] += bias
    if params.bad_words:
        _ban_bad_words(logits, params.bad_words, history)
    if history and (params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty):
        _apply_penalties(logits, params, history)
    if params.end_id is not None and item.num_output_tokens < params.min_tokens:
        logits[params.end_id] = float("-inf")
    allowed = item.allowed_tokens
    if allowed is not None:
        masked = logits.masked_fill(~allowed, float("-inf"))
        # Only these processors set -inf: without them the grammar always leaves a token.
        could_empty = params.logit_bias or params.bad_words or (params.end_id is not None and item.num_output_tokens < params.min_tokens)
        logits = masked if not could_empty or bool(torch.isfinite(masked).any()) else raw.masked_fill(~allowed, float("-inf"))
    return logits


def _ban_bad_words(logits: torch.Tensor, bad_words: Sequence[tuple[int, ...]], history: Sequence[int]) -> None:
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or (len(prefix) <= len(history) and tuple(history[-len(prefix) :]) == prefix):
            logits[word[-1]] = float("-inf")


def _apply_penalties(logits: torch.Tensor, params: SamplingParams, history: Sequence[int]) -> None:
    ids, counts = torch.unique(torch.tensor(history, dtype=torch.int64), return_counts=True)
    if params.repetition_penalty != 1.0:  # Hugging Face's RepetitionPenaltyLogitsProcessor
        scores = logits[ids]
        logits[ids] = torch.where(scores < 0, scores * params.repetition_penalty, scores / params.repetition_penalty)
    if params.presence_penalty:
        logits[ids] -= params.presence_penalty
    if params.frequency_penalty:
        logits[ids] -= params.frequency_penalty * counts.to(logits.dtype)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    logits = logits.clone()
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k).values[-1]
        logits[logits < kth_largest] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        remove = mass_before > top_p  # the token crossing top_p is kept, so is the first
        logits[order[remove]] = float("-inf")
    return logits


class Sampler:
    def sample(self, logits: torch.Tensor, items: Sequence[ScheduledSequence]) -> dict[int, tuple[SampledToken, ...]]:
        """`logits` [len(items), vocab] float32: one row per item with num_samples > 0."""
        sampled: dict[int, tuple[SampledToken, ...]] = {}
        for row, item in zip(logits, items):
            params = item.sampling_params
            if params.beam_width > 1:  # Hugging Face's order: log-softmax first, then the processors
                sampled[item.seq_id] = (SampledToken(-1, beam_log_probs=apply_logit_processors(torch.log_softmax(row, dim=-1), item)),)
                continue
            processed = apply_logit_processors(row, item)
            raw_logprobs = torch.log_softmax(row, dim=-1) if params.logprobs is not None else None
            position = item.num_total_tokens
            tokens = []
            for offset in range(item.num_samples):
                token_id = self._choose(processed, params, item.sampling_seed, item.first_sample_index + offset, position)
                token = with_logprobs(token_id, raw_logprobs, params.logprobs)
                tokens.append(dataclasses.replace(token, logits=row) if params.return_generation_logits else token)
            sampled[item.seq_id] = tuple(tokens)
        return sampled

    @staticmethod
    def _choose(logits: torch.Tensor, params: SamplingParams, seed: int, sample_index: int, position: int) -> int:
        if params.is_greedy:
            return int(torch.argmax(logits))
        return draw(sampling_probs(logits, params), draw_seed(seed, sample_index, position))


def sampling_probs(processed: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy draw takes from a processed row: temperature, top-k, top-p."""
    return torch.softmax(filter_top_k_top_p(processed / params.temperature, params.top_k, params.top_p), dim=-1)


def draw(probs: torch.Tensor, seed: int) -> int:
    return int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)))


def with_logprobs(token_id: int, raw_logprobs: torch.Tensor | None, num_top: int | None) -> SampledToken:
    if raw_logprobs is None or num_top is None:
        return SampledToken(token_id)
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        values, ids = torch.topk(raw_logprobs, min(num_top, raw_logprobs.shape[-1]))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return SampledToken(token_id, float(raw_logprobs[token_id]), top)

"""Prompt-lookup (n-gram) drafting: no model, the sequence's own text proposes.

The longest suffix of the sequence (prompt + output), up to `max_matching_ngram_size` tokens, is
looked up earlier in the sequence; the tokens that followed its most recent earlier occurrence
are the draft (TensorRT-LLM's NGram / prompt-lookup decoding). Code and repetitive text repeat
themselves, so the target often agrees. The draft is deterministic: q = one-hot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from refengine.speculative.planner import Draft, DraftRequest


def propose_ngram(token_ids: Sequence[int], max_matching_ngram_size: int, num_draft_tokens: int) -> tuple[int, ...]:
    tokens = list(token_ids)
    length = len(tokens)
    for size in range(min(max_matching_ngram_size, length - 1), 0, -1):
        suffix = tokens[length - size :]
        for start in range(length - size - 1, -1, -1):
            if tokens[start : start + size] == suffix:
                return tuple(tokens[start + size : start + size + num_draft_tokens])
    return ()


class NGramDrafter:
    has_draft_distribution = False  # deterministic drafts: verified as q = one-hot
    description = "n-grams"

    def __init__(self, max_matching_ngram_size: int) -> None:
        self.max_matching_ngram_size = max_matching_ngram_size

    def propose(self, requests: Sequence[DraftRequest]) -> dict[int, Draft]:
        drafts = {}
        for request in requests:
            tokens = propose_ngram(request.token_ids, self.max_matching_ngram_size, request.num_draft_tokens)
            if tokens:
                drafts[request.seq_id] = Draft(tokens)
        return drafts

    def release(self, seq_ids: Iterable[int]) -> None:
        """Nothing is kept per sequence."""

"""Teacher-forced scoring of token sequences: per-position log-likelihoods and argmax predictions.

Used for perplexity and token-agreement checks of (quantized) checkpoints. Each sequence is
prefilled as one chunk through the same paged model path the engine uses, so quantized weights
and a quantized KV cache are exercised exactly as in serving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refengine.errors import InvalidRequestError
from refengine.model_runner.attention import build_attention_metadata
from refengine.model_runner.decoder import DecoderModel
from refengine.model_runner.runner import ModelRunner

_TOKENS_PER_BLOCK = 32


@dataclass(frozen=True)
class SequenceScore:
    token_logprobs: torch.Tensor  # [len - 1]: log p(token[i+1] | tokens[..i])
    predictions: torch.Tensor  # [len - 1]: argmax next token after tokens[..i]

    @property
    def nll(self) -> float:
        return float(-self.token_logprobs.sum())


def perplexity(scores: Sequence[SequenceScore]) -> float:
    total = sum(score.nll for score in scores)
    count = sum(len(score.token_logprobs) for score in scores)
    return math.exp(total / count)


@torch.inference_mode()
def score_sequences(model: DecoderModel, sequences: Sequence[Sequence[int]]) -> list[SequenceScore]:
    longest = max((len(sequence) for sequence in sequences), default=0)
    runner = ModelRunner(model, num_blocks=max(1, math.ceil(longest / _TOKENS_PER_BLOCK)), tokens_per_block=_TOKENS_PER_BLOCK)
    scores = []
    for sequence in sequences:
        if len(sequence) < 2:
            raise InvalidRequestError("sequence", f"needs at least 2 tokens to score, got {len(sequence)}")
        if min(sequence) < 0 or max(sequence) >= model.vocab_size:
            raise InvalidRequestError("sequence", f"token ids must be in [0, {model.vocab_size})")
        blocks = list(range(math.ceil(len(sequence) / _TOKENS_PER_BLOCK)))
        metadata = build_attention_metadata([len(sequence)], [0], [blocks], _TOKENS_PER_BLOCK)
        ids = torch.tensor(sequence, dtype=torch.int64)
        logits = model.compute_logits(model.forward(ids, runner.kv_caches, metadata))[:-1]
        logprobs = torch.log_softmax(logits, dim=-1)
        scores.append(SequenceScore(logprobs.gather(1, ids[1:, None]).squeeze(1), logits.argmax(dim=-1)))
    return scores

"""What the engine hands back: one `RequestOutput` per request per step it advanced."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from refengine.step_messages import SampledToken

TokenLogprob = SampledToken


@dataclass(frozen=True)
class CompletionOutput:
    """One sample (of `n`) of a request, cumulative so far."""

    index: int
    token_ids: tuple[int, ...]
    # added since this request's previous output; beam search: the whole beam in every output (from
    # one step to the next a returned beam may continue another, so its tokens are replaced, not extended)
    new_token_ids: tuple[int, ...]
    finish_reason: str | None = None  # "length", "stop", "aborted"
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per output token, when requested
    # return_generation_logits: [len(new_token_ids), vocab] float32, the raw logits each new token was drawn from
    new_generation_logits: torch.Tensor | None = field(default=None, compare=False)
    # beam search: the beam's summed log-probability (its end token included); None otherwise
    cum_log_prob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestMetrics:
    """When a request arrived, was first scheduled and produced tokens (nanoseconds since the Unix
    epoch; None until it happened), and the KV blocks it was given: newly allocated, or reused
    from the prefix cache (TensorRT-LLM's per-request perf metrics). A preempted request that is
    recomputed counts the blocks it is given again, as TensorRT-LLM does."""

    arrival_time_ns: int
    first_scheduled_time_ns: int | None = None
    first_token_time_ns: int | None = None
    last_token_time_ns: int | None = None
    kv_new_blocks: int = 0
    kv_reused_blocks: int = 0
    # Speculative decoding (TensorRT-LLM's total_draft_tokens / total_accepted_draft_tokens):
    # draft tokens the target verified for this request, and how many it accepted.
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0

    @property
    def kv_total_blocks(self) -> int:
        return self.kv_new_blocks + self.kv_reused_blocks

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (TensorRT-LLM's acceptance_rate); 0.0 when nothing was drafted."""
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    metrics: RequestMetrics | None = None
    # return_context_logits: [prompt, vocab] float32, in every output once the prompt is computed
    context_logits: torch.Tensor | None = field(default=None, compare=False)

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)

"""What the engine keeps per request between steps: its completions (one per sample or beam) with the tokens,
log-probs and logits not yet reported, its timestamps and draft counts, and when a step reports it
(`stream_interval`). `snapshot` turns that state into the `RequestOutput` a step returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from refengine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from refengine.sampling import SamplingParams
from refengine.scheduler import SequenceUpdate
from refengine.step_messages import SampledToken


@dataclass
class CompletionState:
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[SampledToken] = field(default_factory=list)
    generation_logits: list[torch.Tensor] = field(default_factory=list)  # rows not yet reported
    num_reported: int = 0
    finish_reason: str | None = None
    cum_log_prob: float | None = None  # beam search

    def snapshot(self, with_logprobs: bool, with_logits: bool) -> CompletionOutput:
        new = tuple(self.token_ids[self.num_reported :])
        self.num_reported = len(self.token_ids)
        logits = None
        if with_logits:
            rows, self.generation_logits = self.generation_logits[: len(new)], self.generation_logits[len(new) :]
            logits = torch.stack(rows) if rows else torch.zeros((0, 0), dtype=torch.float32)
        return CompletionOutput(
            index=self.index,
            token_ids=tuple(self.token_ids),
            new_token_ids=new,
            finish_reason=self.finish_reason,
            logprobs=tuple(self.logprobs) if with_logprobs else None,
            new_generation_logits=logits,
            cum_log_prob=self.cum_log_prob,
        )


@dataclass
class RequestState:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    completions: list[CompletionState]
    arrival_time_ns: int = field(default_factory=time.time_ns)
    first_scheduled_time_ns: int | None = None
    first_token_time_ns: int | None = None
    last_token_time_ns: int | None = None
    context_logits: torch.Tensor | None = None  # [prompt, vocab], filled as the prompt is computed
    context_rows_filled: int = 0  # rows 0.. filled: the prompt is computed in order (no cached prefix)
    draft_tokens: list[int] = field(default_factory=lambda: [0, 0])  # speculative: [drafted, accepted]
    decoding_steps: int = 0  # steps that gave this request tokens (TensorRT-LLM's decoding_iter)
    gained_tokens: bool = False  # this step gave it tokens
    lora_task_id: int | None = None  # its LoRA adapter, pinned in the cache while the request lives

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)

    def apply(self, update: SequenceUpdate, now_ns: int) -> None:
        completion = self.completions[update.sample_index]
        if update.new_token_ids:
            self.gained_tokens = True
            if self.first_token_time_ns is None:
                self.first_token_time_ns = now_ns
            self.last_token_time_ns = now_ns
        if update.replaces_output:  # beam search: the beam whole; it may continue another beam than before
            completion.token_ids, completion.logprobs, completion.num_reported = [], [], 0
        completion.token_ids.extend(update.new_token_ids)
        self.draft_tokens[0] += update.num_draft_tokens
        self.draft_tokens[1] += update.num_accepted_draft_tokens
        completion.logprobs.extend(s for s in update.new_samples if s.logprob is not None)
        if self.params.return_generation_logits:
            # An end_id sample joins no output (its logits row neither); a stop sequence's last token does.
            drawn = [s.logits for s in update.new_samples if s.logits is not None]
            completion.generation_logits.extend(drawn[: len(update.new_token_ids)])
        if update.cum_log_prob is not None:
            completion.cum_log_prob = update.cum_log_prob
        if update.finish_reason is not None:
            completion.finish_reason = update.finish_reason.value

    def add_context_logits(self, first_position: int, rows: torch.Tensor) -> None:
        """Logits of prompt positions from `first_position` on (a recompute after preemption
        writes the same rows again; rows past the prompt are output tokens, not context)."""
        prompt_length = len(self.prompt_token_ids)
        if self.context_logits is None:
            self.context_logits = torch.empty((prompt_length, rows.shape[-1]), dtype=torch.float32)
        end = min(prompt_length, first_position + rows.shape[0])
        if first_position < end:
            self.context_logits[first_position:end] = rows[: end - first_position]
            self.context_rows_filled = max(self.context_rows_filled, end)

    def output_due(self, stream_interval: int) -> bool:
        """Whether this step reports the request: always when stream_interval is 1 (every step, as before),
        else when it finished, or when this step gave it tokens and is its first decoding step or a
        stream_interval-th one."""
        gained, self.gained_tokens = self.gained_tokens, False
        if gained:
            self.decoding_steps += 1
        if stream_interval == 1 or self.finished:
            return True
        return gained and (self.decoding_steps == 1 or self.decoding_steps % stream_interval == 0)

    def _complete_context_logits(self) -> torch.Tensor | None:
        return self.context_logits if self.context_rows_filled == len(self.prompt_token_ids) else None

    def snapshot(self, block_counts: tuple[int, int]) -> RequestOutput:
        with_logprobs = self.params.logprobs is not None
        metrics = RequestMetrics(
            self.arrival_time_ns, self.first_scheduled_time_ns, self.first_token_time_ns, self.last_token_time_ns, *block_counts, *self.draft_tokens
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            outputs=tuple(c.snapshot(with_logprobs, self.params.return_generation_logits) for c in self.completions),
            metrics=metrics,
            context_logits=self._complete_context_logits(),
        )

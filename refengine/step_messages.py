"""Per-step messages between the scheduler and the model runner.

The scheduler and the model runner never import each other: the scheduler emits a
`SchedulerOutput` (what to compute this step, where its K/V live), the runner answers with a
`RunnerOutput` (the sampled tokens). Both are plain, immutable data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from refengine.sampling import SamplingParams

if TYPE_CHECKING:
    from refengine.lora.adapter import LoraAdapter


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step: a prefill chunk or a single decode token."""

    seq_id: int
    new_token_ids: tuple[int, ...]  # tokens whose K/V are computed this step
    num_computed_tokens: int  # tokens already in the cache = position of new_token_ids[0]
    block_table: tuple[int, ...]  # covers num_computed_tokens + len(new_token_ids) tokens
    num_samples: int  # 0: a prefill chunk short of the end; k >= 1: sample k tokens from the last position
    sampling_params: SamplingParams
    sampling_seed: int
    first_sample_index: int  # sample i of this step draws as sample (first_sample_index + i) of the request
    num_output_tokens: int  # tokens generated so far (for min_tokens)
    num_prompt_tokens: int = 0  # the request's prompt length (0: unknown); a long-RoPE model picks its table by it
    token_history: tuple[int, ...] = ()  # prompt + output so far, only when sampling needs it
    # Speculative decoding: the last len(draft_token_ids) of new_token_ids are proposed tokens
    # that the runner verifies (refengine/speculative); draft_probs [k, vocab] is the draft
    # model's distribution each was drawn from (None: a deterministic draft, n-gram or greedy).
    draft_token_ids: tuple[int, ...] = ()
    draft_probs: torch.Tensor | None = field(default=None, compare=False)
    # guided decoding: bool [vocab], the tokens the sequence's grammar allows at the sampled position
    allowed_tokens: torch.Tensor | None = field(default=None, compare=False)
    # guided + speculative: bool [k, vocab], row j the tokens allowed after draft tokens 0..j
    draft_allowed_tokens: torch.Tensor | None = field(default=None, compare=False)
    lora: LoraAdapter | None = field(default=None, compare=False)  # the request's adapter (refengine/lora), None: the base model
    # Medusa: the draft tokens are the nodes of a tree, not a chain: draft_tree_parents[j] is node j's parent among
    # them (-1: the last real token, the root); parents come before their children (model_runner/tree_attention.py).
    draft_tree_parents: tuple[int, ...] = ()
    # Medusa: return the final hidden state of the row the step's last kept token was drawn from (RunnerOutput.hidden_states)
    return_hidden: bool = False

    @property
    def num_new_tokens(self) -> int:
        return len(self.new_token_ids)

    @property
    def num_total_tokens(self) -> int:
        return self.num_computed_tokens + len(self.new_token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    step_id: int
    scheduled: tuple[ScheduledSequence, ...]
    block_copies: tuple[tuple[int, int], ...] = ()  # (source, destination) blocks, before the forward
    preempted_seq_ids: tuple[int, ...] = ()
    finished_seq_ids: tuple[int, ...] = ()  # finished or aborted since the previous step

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.block_copies


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None = None  # log-probability under the model's raw distribution
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first
    logits: torch.Tensor | None = field(default=None, compare=False)  # the raw row drawn from (return_generation_logits)
    # beam search: the processed log-probabilities [vocab] of the whole row, for the scheduler's beam step
    beam_log_probs: torch.Tensor | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RunnerOutput:
    step_id: int
    # seq_id -> samples: one per sample of n, or for a sequence with draft tokens its accepted
    # draft tokens followed by the token drawn after them (1 to k + 1 tokens of one sample)
    sampled: Mapping[int, tuple[SampledToken, ...]] = field(default_factory=dict)
    # seq_id -> (position of the first row, raw logits [rows, vocab]) of sequences that asked for context logits
    context_logits: Mapping[int, tuple[int, torch.Tensor]] = field(default_factory=dict)
    # seq_id -> final hidden state [hidden] of the row its last token was drawn from (items with return_hidden)
    hidden_states: Mapping[int, torch.Tensor] = field(default_factory=dict)

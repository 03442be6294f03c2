"""Adding draft tokens to a scheduled step (inflight batching: other sequences run beside them).

After the scheduler has chosen the step, every sequence about to sample one token may instead
verify k draft tokens in the same forward pass: its scheduled tokens become the last real token
plus the drafts. k is the request's `num_draft_tokens` (default: the engine's max_draft_len),
cut to the step's remaining `max_num_tokens`, to `max_tokens` (a step yields at most k + 1
tokens, so no draft is ever made past the request's end, nor past max_seq_len, which admission
already checked against prompt + max_tokens) and to the KV blocks the sequence can get without
preempting anyone (no blocks: no drafts this step). Not drafted: a step drawing the first
tokens of n > 1 samples (they fork after it) and requests returning context logits. A guided
sequence's draft ends at the first token its grammar refuses, and carries the grammar's mask
of each draft position (refengine.guided.drafts).

A request that leaves `num_draft_tokens` to the engine gets a draft length adapted to how its
drafts fare (transformers' "heuristic" schedule, generation/candidate_generator.py: +2 after a
step whose drafts were all accepted, else -1, at least 1), between 1 and max_draft_len, starting
at max_draft_len: a draft that keeps missing costs fewer wasted draft forwards and verified rows
(on a CPU every verified row costs GEMM work: BENCHMARKS.md). A request's own num_draft_tokens is
used as given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from refengine.errors import InvalidRequestError
from refengine.guided.drafts import constrain_draft
from refengine.sampling import SamplingParams
from refengine.step_messages import RunnerOutput, ScheduledSequence, SchedulerOutput

if TYPE_CHECKING:
    from refengine.guided.state import GrammarState
    from refengine.scheduler import Scheduler


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int
    token_ids: tuple[int, ...]  # prompt + output; the target computes the last one this step
    num_draft_tokens: int
    params: SamplingParams
    sampling_seed: int
    sample_index: int
    grammar: GrammarState | None = None  # guided: a fork of the sequence's grammar state, the drafter's to advance


@dataclass(frozen=True)
class Draft:
    token_ids: tuple[int, ...]
    probs: torch.Tensor | None = None  # [k, vocab]: what each token was drawn from; None: deterministic


class Drafter(Protocol):
    # whether its drafts come with the distributions they were drawn from (a draft model; n-grams: no)
    has_draft_distribution: bool

    def propose(self, requests: Sequence[DraftRequest]) -> dict[int, Draft]: ...

    def release(self, seq_ids: Iterable[int]) -> None:
        """Forget finished or preempted sequences (a draft model frees their KV blocks)."""


class Speculator:
    def __init__(self, drafter: Drafter, max_draft_len: int, max_num_tokens: int) -> None:
        self.drafter = drafter
        self.max_draft_len = max_draft_len
        self._max_num_tokens = max_num_tokens
        self._adaptive: dict[int, AdaptiveDraftLength] = {}  # seq_id -> its draft length schedule

    def add_drafts(self, output: SchedulerOutput, scheduler: Scheduler) -> SchedulerOutput:
        self.drafter.release(output.preempted_seq_ids + output.finished_seq_ids)
        for seq_id in output.preempted_seq_ids + output.finished_seq_ids:
            self._adaptive.pop(seq_id, None)
        budget = self._max_num_tokens - output.num_scheduled_tokens
        requests = []
        for item in output.scheduled:
            sequence = scheduler.get_sequence(item.seq_id)
            if budget <= 0 or sequence is None or item.num_samples != 1 or item.sampling_params.return_context_logits:
                continue
            if item.sampling_params.beam_width > 1:
                continue  # beam search scores B candidates per step itself; it is not drafted
            params = item.sampling_params
            if params.num_draft_tokens is None:
                schedule = self._adaptive.get(item.seq_id)
                if schedule is None:  # from the counters it has now (a preempted sequence keeps them)
                    schedule = self._adaptive[item.seq_id] = AdaptiveDraftLength(
                        self.max_draft_len, sequence.num_draft_tokens, sequence.num_accepted_draft_tokens
                    )
                wanted = schedule.next_length(sequence.num_draft_tokens, sequence.num_accepted_draft_tokens)
            else:
                wanted = params.num_draft_tokens
            k = min(wanted, params.max_tokens - item.num_output_tokens - 1, budget)
            if k <= 0:
                continue
            budget -= k
            grammar = sequence.grammar.fork() if sequence.grammar is not None else None
            requests.append(DraftRequest(item.seq_id, tuple(sequence.token_ids), k, params, item.sampling_seed, item.first_sample_index, grammar))
        if not requests:
            return output
        drafts = self.drafter.propose(requests)
        scheduled = [self._with_draft(item, drafts.get(item.seq_id), scheduler) for item in output.scheduled]
        # (Copy-on-write happened for the step's first token already; kept for safety.)
        copies = output.block_copies + tuple(scheduler.kv_cache.take_block_copies())
        return dataclasses.replace(output, scheduled=tuple(scheduled), block_copies=copies)

    def check_request(self, params: SamplingParams) -> SamplingParams:
        check_draft_logits(params, self)
        return params

    def after_step(self, output: SchedulerOutput, runner_output: RunnerOutput, scheduler: Scheduler) -> None:
        """Nothing to keep from the step (a draft model tracks its sequences itself)."""

    @staticmethod
    def _with_draft(item: ScheduledSequence, draft: Draft | None, scheduler: Scheduler) -> ScheduledSequence:
        if draft is None or not draft.token_ids:
            return item
        sequence = scheduler.get_sequence(item.seq_id)
        masks = None
        if sequence is not None and sequence.grammar is not None:
            draft, masks = _within_grammar(draft, sequence.grammar)
            if not draft.token_ids:
                return item
        owner = sequence.request_id if sequence is not None else None
        table = scheduler.kv_cache.allocate_slots(item.seq_id, item.num_total_tokens + len(draft.token_ids), owner=owner)
        if table is None:
            return item
        return dataclasses.replace(
            item,
            new_token_ids=item.new_token_ids + draft.token_ids,
            block_table=table,
            draft_token_ids=draft.token_ids,
            # use_draft_logits false: accepted by comparing tokens (verifier.py: q = one-hot of the draft)
            draft_probs=None if item.sampling_params.use_draft_logits is False else draft.probs,
            draft_allowed_tokens=masks,
        )


class HasDrafter(Protocol):
    """A speculator as `check_draft_logits` sees it: `Speculator` or `MedusaSpeculator`."""

    @property
    def drafter(self) -> object: ...


def check_draft_logits(params: SamplingParams, speculator: HasDrafter | None) -> None:
    """use_draft_logits true asks for draft-target acceptance by the draft's distribution: it needs a draft model
    and drafts (TensorRT-LLM's BLS sends draft logits only with a draft model and num_draft_tokens > 0)."""
    if not params.use_draft_logits:
        return
    if speculator is None or not getattr(speculator.drafter, "has_draft_distribution", False):
        drafts = getattr(speculator.drafter, "description", "n-grams") if speculator is not None else ""
        how = "built without speculative decoding" if speculator is None else f"drafting {drafts} (no draft distribution)"
        raise InvalidRequestError("use_draft_logits", f"true needs a draft model (draft-target mode); the engine is {how}")
    if params.num_draft_tokens == 0:
        raise InvalidRequestError("use_draft_logits", "true with num_draft_tokens 0 (no drafts): send num_draft_tokens > 0 or unset")


def _within_grammar(draft: Draft, grammar: GrammarState) -> tuple[Draft, torch.Tensor | None]:
    """The draft up to the first token the grammar refuses, and its masks (refengine.guided.drafts)."""
    kept, masks = constrain_draft(grammar, draft.token_ids)
    probs = draft.probs[:kept] if draft.probs is not None else None
    return Draft(draft.token_ids[:kept], probs), masks


class AdaptiveDraftLength:
    """One sequence's draft length, updated from its draft counters (drafted / accepted so far)."""

    def __init__(self, max_draft_len: int, num_drafted: int = 0, num_accepted: int = 0) -> None:
        self.max_draft_len = max_draft_len
        self.length = max_draft_len
        self._seen = (num_drafted, num_accepted)

    def next_length(self, num_drafted: int, num_accepted: int) -> int:
        drafted, accepted = num_drafted - self._seen[0], num_accepted - self._seen[1]
        self._seen = (num_drafted, num_accepted)
        if drafted > 0:
            self.length = min(self.max_draft_len, self.length + 2) if accepted == drafted else max(1, self.length - 1)
        return self.length

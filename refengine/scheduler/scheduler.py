"""The scheduler: one token-budget loop per step.

Each step it spends at most `max_num_tokens` tokens on at most `max_batch_size` sequences:
running sequences first (oldest first; a decode costs 1 token, a prefill chunk its length),
then waiting ones in arrival order. There are no prefill/decode phases: a step mixes prefill
chunks and decodes. The scheduler owns the KV-cache manager; the model runner only sees the
block tables in the `SchedulerOutput`.

When blocks run out for a running sequence, the newest running sequence is preempted by
recompute (its blocks are freed, it goes back to the waiting queue and later recomputes its
prompt and output). `guaranteed_no_evict` admits only what can finish, so it never preempts;
`max_utilization` admits whatever fits now.

`batching="static"` (TensorRT-LLM's V1 batching, Hugging Face `generate`): see
`static_batch.py`. A batch is formed only when none is running and is held until its longest
request ends; finished sequences stay in it as padding rows that are computed every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceType
from typing import TYPE_CHECKING

from refengine.config import BatchingMode, EngineConfig, SchedulerPolicy
from refengine.kv_cache import KVCacheManager
from refengine.sampling import SamplingParams
from refengine.scheduler.admission import no_evict_allows
from refengine.scheduler.beams import BeamGroups, finish_beams, reassign_beams, running_beam_updates
from refengine.scheduler.choice import Choice
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.scheduled import scheduled_sequence
from refengine.scheduler.sequence import FinishReason, Sequence, SequenceStatus, SequenceUpdate
from refengine.scheduler.speculative_update import apply_verified
from refengine.scheduler.static_batch import batch_slots, padding_row, release_padding_rows
from refengine.scheduler.static_schedule import StaticScheduling
from refengine.step_messages import RunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from refengine.guided.state import GrammarState
    from refengine.lora.adapter import LoraAdapter


class Scheduler(StaticScheduling):
    def __init__(self, config: EngineConfig, long_prompt_threshold: int | None = None) -> None:
        """`long_prompt_threshold`: the model fills the KV cache differently for prompts longer than this
        (`KVCacheLayout.long_prompt_threshold`); their cached prefixes are kept apart."""
        self._config = config
        self._long_prompt_threshold = long_prompt_threshold
        self._kv = KVCacheManager(
            num_blocks=config.total_kv_blocks,
            tokens_per_block=config.tokens_per_block,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self._waiting = SequenceQueue()
        self._running = SequenceQueue()
        self._static = config.batching is BatchingMode.STATIC
        self._padding_rows = SequenceQueue()  # static batching: finished rows held until the batch ends
        self._beams = BeamGroups()
        self._sequences: dict[int, Sequence] = {}
        self._seq_ids_by_request: dict[str, list[int]] = {}
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self._step_ids = itertools.count()
        self._finished_since_last_step: list[int] = []
        self._num_preemptions = 0
        self._num_padding_tokens = 0
        self._num_prefix_cache_hit_tokens = 0
        self._num_prefix_cache_hits = 0  # admissions that reused at least one cached block
        self._num_prompt_tokens_computed = 0  # prompt tokens scheduled; recompute after preemption included

    def _is_long_prompt(self, prompt_len: int) -> bool:
        return self._long_prompt_threshold is not None and prompt_len > self._long_prompt_threshold

    # -- state -----------------------------------------------------------------------------
    @property
    def kv_cache(self) -> KVCacheManager:
        return self._kv

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    @property
    def num_prefix_cache_hit_tokens(self) -> int:
        """Prompt tokens whose K/V were reused from the cache instead of computed."""
        return self._num_prefix_cache_hit_tokens

    @property
    def num_prefix_cache_hits(self) -> int:
        return self._num_prefix_cache_hits

    @property
    def num_prompt_tokens_computed(self) -> int:
        return self._num_prompt_tokens_computed

    @property
    def num_padding_rows(self) -> int:
        """Static batching: finished sequences still held (and computed) in the running batch."""
        return len(self._padding_rows)

    @property
    def num_padding_tokens(self) -> int:
        """Static batching: padding tokens computed (and discarded) by held rows so far."""
        return self._num_padding_tokens

    def get_sequence(self, seq_id: int) -> Sequence | None:
        """An unfinished sequence by id (None once finished)."""
        return self._sequences.get(seq_id)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._seq_ids_by_request

    def sequences_of(self, request_id: str) -> list[Sequence]:
        return [self._sequences[i] for i in self._seq_ids_by_request.get(request_id, [])]

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: SequenceType[int],
        params: SamplingParams,
        sampling_seed: int,
        grammar: GrammarState | None = None,
        lora: LoraAdapter | None = None,
    ) -> Sequence:
        """Queue a request. It must already be validated (see `request_validation`); `grammar` is its
        guided-decoding state (the sequence owns it; forks of the sequence fork it); `lora` its adapter, whose
        sequences reuse only prefix blocks computed under it."""
        if request_id in self._seq_ids_by_request:
            raise KeyError(f"request {request_id!r} is already scheduled")
        sequence = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            sample_index=0,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            sampling_seed=sampling_seed,
            arrival_order=next(self._arrivals),
            num_pending_samples=params.num_sequences,
            grammar=grammar,
            prefix_salt=(b"long-prompt" if self._is_long_prompt(len(prompt_token_ids)) else b"") + (lora.prefix_salt if lora else b""),
            lora=lora,
        )
        if params.beam_width > 1:
            self._beams.add(sequence)
        self._sequences[sequence.seq_id] = sequence
        self._seq_ids_by_request[request_id] = [sequence.seq_id]
        self._waiting.insert(sequence)
        return sequence

    def abort_request(self, request_id: str) -> list[Sequence]:
        """Finish every sequence of the request now, freeing its blocks. Unknown id: no-op."""
        aborted = []
        for sequence in self.sequences_of(request_id):
            self._finish(sequence, FinishReason.ABORTED)
            aborted.append(sequence)
        return aborted

    # -- one step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._static:
            return self._schedule_static()
        budget = self._config.max_num_tokens
        choices: list[Choice] = []
        preempted: list[Sequence] = []
        skipped_group = None  # a beam group decodes all its beams in one step, or waits
        for sequence in self._beams.scheduling_order(self._running):
            if budget <= 0:
                break
            if sequence.status is not SequenceStatus.RUNNING or sequence.request_id == skipped_group:
                continue  # preempted during this step, or its beam group does not fit the budget
            if self._beams.group_size_at(sequence) > budget:
                skipped_group = sequence.request_id
                continue
            num_new = self._num_tokens_to_schedule(sequence.num_uncomputed_tokens, budget)
            if num_new == 0:
                continue
            table = self._allocate_or_preempt(sequence, num_new, preempted)
            if table is None:
                break  # the sequence itself was preempted: it was the newest one left
            choices.append(Choice(sequence, num_new, table))
            budget -= num_new
        if not preempted:
            budget = self._admit_waiting(budget, choices)
        return self._make_output(choices, preempted)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput
    ) -> list[SequenceUpdate]:
        """Apply the sampled tokens: extend, fork (n > 1), finish; returns what changed."""
        updates: list[SequenceUpdate] = []
        beam_rows = {}
        for item in scheduler_output.scheduled:
            sequence = self._sequences.get(item.seq_id)
            if sequence is None or sequence.status is not SequenceStatus.RUNNING:
                continue
            self._kv.cache_computed_blocks(sequence.seq_id, sequence.token_ids, sequence.num_computed_tokens, sequence.prefix_salt)
            if item.num_samples == 0:
                continue
            samples = runner_output.sampled.get(item.seq_id, ())
            if item.draft_token_ids:
                updates.append(apply_verified(sequence, item, samples, self._kv))
                if updates[-1].finish_reason is not None:
                    self._finish(sequence, updates[-1].finish_reason)
                continue
            if self._beams.is_beam(item.seq_id):
                beam_rows[item.seq_id] = samples[0].beam_log_probs
                continue
            if len(samples) != item.num_samples:
                raise ValueError(
                    f"runner returned {len(samples)} samples for sequence {item.seq_id}, "
                    f"expected {item.num_samples}"
                )
            family = [sequence] + self._fork(sequence, len(samples) - 1)
            for member, sample in zip(family, samples):
                added, reason = member.append_sample(sample)
                updates.append(
                    SequenceUpdate(
                        seq_id=member.seq_id,
                        request_id=member.request_id,
                        sample_index=member.sample_index,
                        new_token_ids=added,
                        new_samples=(sample,) if added else (),
                        finish_reason=reason,
                    )
                )
                if reason is not None:
                    self._finish(member, reason)
        for group, step in self._beams.step(beam_rows):
            if step.done:
                updates += finish_beams(group, [self._sequences[i] for i in group.member_ids], self._finish)
                continue
            if len(group.member_ids) < group.width:  # the prompt's step: fork it into the beams
                for child in self._fork(self._sequences[group.member_ids[0]], group.width - 1):
                    self._beams.add_member(group, child.seq_id)
            members = [self._sequences[i] for i in group.member_ids]
            reassign_beams(self._kv, group, members, step)
            updates += running_beam_updates(group, members)
        return updates

    # -- internals -------------------------------------------------------------------------
    def _num_tokens_to_schedule(self, remaining: int, budget: int) -> int:
        """All `remaining` tokens if the budget allows, else a chunk (if allowed) or nothing.

        Without chunked context a sequence longer than max_num_tokens (possible only when it
        recomputes prompt + output after preemption) is still chunked, or it could never run.
        """
        chunkable = self._config.enable_chunked_context or remaining > self._config.max_num_tokens
        if remaining <= budget:
            return remaining
        return budget if chunkable else 0

    def _allocate_or_preempt(
        self, sequence: Sequence, num_new: int, preempted: list[Sequence]
    ) -> tuple[int, ...] | None:
        while True:
            table = self._kv.allocate_slots(sequence.seq_id, sequence.num_computed_tokens + num_new, owner=sequence.request_id)
            if table is not None:
                return table
            victim = next((s for s in reversed(list(self._running)) if not self._beams.is_beam(s.seq_id)), None)
            if victim is None:  # beams are admitted with a full reservation: this would be a bug
                raise RuntimeError(f"no KV blocks for beam sequence {sequence.seq_id} and nothing to preempt")
            self._preempt(victim)
            preempted.append(victim)
            if victim is sequence:
                return None

    def _admit_waiting(self, budget: int, choices: list[Choice]) -> int:
        policy = self._config.scheduler_policy
        while budget > 0 and self._waiting:
            sequence = self._waiting.peek_oldest()
            if self._num_batch_slots() + sequence.num_pending_samples > self._config.max_batch_size:
                break
            prefix = self._kv.find_cached_prefix(sequence.cacheable_token_ids, sequence.prefix_salt)
            num_new = self._num_tokens_to_schedule(sequence.num_tokens - prefix.num_tokens, budget)
            if num_new == 0:
                break
            if policy is SchedulerPolicy.GUARANTEED_NO_EVICT and not no_evict_allows(
                self._kv, self._running, sequence, prefix
            ):
                break
            if sequence.params.beam_width > 1 and not no_evict_allows(  # beams are never preempted:
                self._kv, self._beams.members(self._running), sequence, prefix  # reserve them in any policy
            ):
                break
            table = self._kv.allocate_slots(sequence.seq_id, prefix.num_tokens + num_new, prefix, owner=sequence.request_id)
            if table is None:
                break
            self._waiting.remove(sequence)
            sequence.num_computed_tokens = prefix.num_tokens
            self._num_prefix_cache_hit_tokens += prefix.num_tokens
            self._num_prefix_cache_hits += prefix.num_tokens > 0
            sequence.status = SequenceStatus.RUNNING
            self._running.insert(sequence)
            choices.append(Choice(sequence, num_new, table))
            budget -= num_new
        return budget

    def _num_batch_slots(self) -> int:
        return batch_slots(self._running)

    def _preempt(self, sequence: Sequence) -> None:
        self._running.remove(sequence)
        self._kv.free(sequence.seq_id)
        sequence.num_computed_tokens = 0
        sequence.num_preemptions += 1
        sequence.status = SequenceStatus.WAITING
        self._waiting.insert(sequence)
        self._num_preemptions += 1

    def _fork(self, parent: Sequence, num_children: int) -> list[Sequence]:
        children = []
        for offset in range(1, num_children + 1):
            child = parent.fork(next(self._seq_ids), parent.sample_index + offset)
            self._kv.fork(parent.seq_id, child.seq_id)
            self._sequences[child.seq_id] = child
            self._seq_ids_by_request[parent.request_id].append(child.seq_id)
            self._running.insert(child)
            children.append(child)
        parent.num_pending_samples = 1
        return children

    def _finish(self, sequence: Sequence, reason: FinishReason) -> None:
        if sequence.is_finished:
            return
        was_running = self._running.remove(sequence)
        if not was_running:
            self._waiting.remove(sequence)
        if self._static and was_running and reason is not FinishReason.ABORTED:
            self._padding_rows.insert(sequence)  # keeps its slot and blocks until the batch ends
        else:
            self._kv.free(sequence.seq_id)
        if self._static and not self._running:
            release_padding_rows(self._kv, self._padding_rows)  # the batch's longest request has ended
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason
        self._beams.forget(sequence.seq_id)
        del self._sequences[sequence.seq_id]
        siblings = self._seq_ids_by_request.get(sequence.request_id, [])
        if sequence.seq_id in siblings:
            siblings.remove(sequence.seq_id)
        if not siblings:
            self._seq_ids_by_request.pop(sequence.request_id, None)
        self._finished_since_last_step.append(sequence.seq_id)

    def _make_output(self, choices: list[Choice], preempted: list[Sequence]) -> SchedulerOutput:
        scheduled = []
        for choice in choices:
            sequence = choice.sequence
            if choice.padding:
                scheduled.append(padding_row(sequence, choice.block_table))
                continue
            start = sequence.num_computed_tokens
            end = start + choice.num_new_tokens
            self._num_prompt_tokens_computed += max(0, min(end, sequence.num_prompt_tokens) - start)
            scheduled.append(scheduled_sequence(sequence, start, end, choice.block_table))
            sequence.num_computed_tokens = end
        finished, self._finished_since_last_step = self._finished_since_last_step, []
        return SchedulerOutput(
            step_id=next(self._step_ids),
            scheduled=tuple(scheduled),
            block_copies=tuple(self._kv.take_block_copies()),
            preempted_seq_ids=tuple(s.seq_id for s in preempted),
            finished_seq_ids=tuple(finished),
        )

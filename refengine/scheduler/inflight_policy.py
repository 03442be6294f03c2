"""Inflight batching (`EngineConfig.batching="inflight"`): one token-budget loop per step.

Running sequences first (beam groups, then the rest, oldest first; a decode costs 1 token, a
prefill chunk its length), then waiting ones in arrival order, while the budget, the batch
size and the admission rule allow. When blocks run out for a running sequence, the newest
running sequence without beams is preempted by recompute: its blocks are freed and it goes back
to the waiting queue, to recompute its prompt and output later.
"""

from __future__ import annotations

from refengine.config import EngineConfig, SchedulerPolicy
from refengine.kv_cache import KVCacheManager
from refengine.scheduler.admission import batch_slots, no_evict_allows
from refengine.scheduler.beams import BeamGroups
from refengine.scheduler.choice import Choice
from refengine.scheduler.policy import StepPlan, tokens_to_schedule
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.sequence import Sequence, SequenceStatus


class InflightBatching:
    """A `BatchingPolicy` over the scheduler's queues, KV cache and beam groups (shared, not copied)."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, waiting: SequenceQueue, running: SequenceQueue, beams: BeamGroups) -> None:
        self._config = config
        self._kv = kv
        self._waiting = waiting
        self._running = running
        self._beams = beams

    @property
    def num_padding_rows(self) -> int:
        return 0

    def retire(self, sequence: Sequence, was_running: bool, aborted: bool) -> None:
        self._kv.free(sequence.seq_id)

    def schedule(self) -> StepPlan:
        budget = self._config.max_num_tokens
        plan = StepPlan()
        skipped_group = None  # a beam group decodes all its beams in one step, or waits
        for sequence in self._beams.scheduling_order(self._running):
            if budget <= 0:
                break
            if sequence.status is not SequenceStatus.RUNNING or sequence.request_id == skipped_group:
                continue  # preempted during this step, or its beam group does not fit the budget
            if self._beams.group_size_at(sequence) > budget:
                skipped_group = sequence.request_id
                continue
            num_new = tokens_to_schedule(self._config, sequence.num_uncomputed_tokens, budget)
            if num_new == 0:
                continue
            table = self._allocate_or_preempt(sequence, num_new, plan.preempted)
            if table is None:
                break  # the sequence itself was preempted: it was the newest one left
            plan.choices.append(Choice(sequence, num_new, table))
            budget -= num_new
        if not plan.preempted:
            self._admit_waiting(budget, plan.choices)
        return plan

    def _allocate_or_preempt(self, sequence: Sequence, num_new: int, preempted: list[Sequence]) -> tuple[int, ...] | None:
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

    def _admit_waiting(self, budget: int, choices: list[Choice]) -> None:
        policy = self._config.scheduler_policy
        while budget > 0 and (sequence := self._waiting.peek_oldest()) is not None:
            if batch_slots(self._running) + sequence.num_pending_samples > self._config.max_batch_size:
                break
            prefix = self._kv.find_cached_prefix(sequence.cacheable_token_ids, sequence.prefix_salt)
            num_new = tokens_to_schedule(self._config, sequence.num_tokens - prefix.num_tokens, budget)
            if num_new == 0:
                break
            if policy is SchedulerPolicy.GUARANTEED_NO_EVICT and not no_evict_allows(self._kv, self._running, sequence, prefix):
                break
            if sequence.params.beam_width > 1 and not no_evict_allows(  # beams are never preempted:
                self._kv,
                self._beams.members(self._running),
                sequence,
                prefix,  # reserve them in any policy
            ):
                break
            table = self._kv.allocate_slots(sequence.seq_id, prefix.num_tokens + num_new, prefix, owner=sequence.request_id)
            if table is None:
                break
            self._waiting.remove(sequence)
            sequence.num_computed_tokens = prefix.num_tokens
            sequence.status = SequenceStatus.RUNNING
            self._running.insert(sequence)
            choices.append(Choice(sequence, num_new, table, num_cached_tokens=prefix.num_tokens))
            budget -= num_new

    def _preempt(self, sequence: Sequence) -> None:
        self._running.remove(sequence)
        self._kv.free(sequence.seq_id)
        sequence.num_computed_tokens = 0
        sequence.num_preemptions += 1
        sequence.status = SequenceStatus.WAITING
        self._waiting.insert(sequence)

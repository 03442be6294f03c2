"""Inflight batching (`EngineConfig.batching="inflight"`): one token-budget loop per step.

First, preemption by priority (`priority_preemption.py`): if the first waiting sequence of the
admission order does not fit, running sequences of lower priority make room for it. Then running
sequences (beam groups, then the rest in queue order: higher priority first, then oldest; a decode
costs 1 token, a prefill chunk its length), then waiting ones in admission order
(`admission_order.py`: starved ones, then by priority), while the budget, the batch size and the
admission rule allow. When blocks run out for a running sequence, the last running sequence
without beams (the newest of the lowest priority) is preempted by recompute: its blocks are freed
and it goes back to the waiting queue, to recompute its prompt and output later.
"""

from __future__ import annotations

from refengine.config import EngineConfig, SchedulerPolicy
from refengine.kv_cache import KVCacheManager
from refengine.scheduler.admission import batch_slots, no_evict_allows
from refengine.scheduler.admission_order import admission_order
from refengine.scheduler.beams import BeamGroups
from refengine.scheduler.choice import Choice
from refengine.scheduler.policy import StepPlan, tokens_to_schedule
from refengine.scheduler.priority_preemption import PriorityPreemption
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
        self._priority_preemption = PriorityPreemption(config, kv, running, beams)

    @property
    def num_padding_rows(self) -> int:
        return 0

    def retire(self, sequence: Sequence, was_running: bool, aborted: bool) -> None:
        self._kv.free(sequence.seq_id)

    def schedule(self, step: int) -> StepPlan:
        budget = self._config.max_num_tokens
        plan = StepPlan()
        order = admission_order(self._config, self._kv, self._waiting, step)
        if order:  # before any running sequence is scheduled, so no choice of this step is undone
            for victim in self._priority_preemption.victims_for(order[0], step):
                self._preempt(victim)
                plan.preempted.append(victim)
        preempted_for_priority = len(plan.preempted)
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
        if len(plan.preempted) == preempted_for_priority:  # none admitted once blocks ran out for a running sequence
            self._admit_waiting(budget, plan.choices, admission_order(self._config, self._kv, self._waiting, step), plan.preempted)
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

    def _admit_waiting(self, budget: int, choices: list[Choice], order: list[Sequence], preempted: list[Sequence]) -> None:
        """Admit from `order` until one does not fit; the sequences preempted this step wait for the next."""
        policy = self._config.scheduler_policy
        for sequence in order:
            if budget <= 0:
                break
            if any(sequence is victim for victim in preempted):
                continue
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

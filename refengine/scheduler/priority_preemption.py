"""Preemption by priority (inflight batching): making room for the first waiting sequence.

At the start of a step, before any running sequence is scheduled, the head of the admission order
(`admission_order.py`) is checked: if it does not fit (no batch row, or not the KV blocks its admission
needs under the scheduler policy), running sequences of strictly lower priority are preempted by
recompute, the lowest-priority newest first (the end of the running queue), until it fits. Nothing is
preempted unless the chosen victims make it fit. Never victims: beams (admitted with a full reservation),
starved sequences (the guard's promise: once in, a starved sequence is not pushed out again for priority),
and sequences of the head's priority or higher, so with one priority for all nothing is ever preempted
here, and guaranteed_no_evict keeps its promise among equals. Across priorities guaranteed_no_evict does
preempt: a lower-priority sequence gives up its reservation (and recomputes later) for a higher one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as SequenceType

from refengine.config import EngineConfig, SchedulerPolicy
from refengine.kv_cache import KVCacheManager
from refengine.scheduler.admission import batch_slots, blocks_to_admit, blocks_to_finish
from refengine.scheduler.admission_order import is_starved
from refengine.scheduler.beams import BeamGroups
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.sequence import Sequence


def blocks_freed_by(kv: KVCacheManager, victims: SequenceType[Sequence]) -> int:
    """Blocks that become free when every victim's blocks are released (a block shared with a sequence kept stays)."""
    references = Counter(block_id for victim in victims for block_id in kv.block_table(victim.seq_id))
    return sum(1 for block_id, count in references.items() if kv.pool.block(block_id).ref_count == count)


class PriorityPreemption:
    """Chooses the victims that make room for a waiting sequence (the queues and cache are the policy's, shared)."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, running: SequenceQueue, beams: BeamGroups) -> None:
        self._config = config
        self._kv = kv
        self._running = running
        self._beams = beams

    def victims_for(self, head: Sequence, step: int) -> list[Sequence]:
        """The running sequences to preempt so that `head` fits this step; empty when it fits already or cannot be made to."""
        if self._fits(head, []):
            return []
        victims: list[Sequence] = []
        for sequence in reversed(list(self._running)):
            if self._beams.is_beam(sequence.seq_id) or sequence.priority >= head.priority or is_starved(self._config, sequence, step):
                continue
            victims.append(sequence)
            if self._fits(head, victims):
                return victims
        return []

    def _fits(self, head: Sequence, victims: list[Sequence]) -> bool:
        """Whether `head` could be admitted this step once `victims` are gone (the admission rules, counted ahead)."""
        kept = [s for s in self._running if all(s is not victim for victim in victims)]
        if batch_slots(kept) + head.num_pending_samples > self._config.max_batch_size:
            return False
        kv = self._kv
        free = kv.num_free_blocks + blocks_freed_by(kv, victims)
        prefix = kv.find_cached_prefix(head.cacheable_token_ids, head.prefix_salt)
        no_evict = self._config.scheduler_policy is SchedulerPolicy.GUARANTEED_NO_EVICT
        if no_evict or head.params.beam_width > 1:  # the reservations admission checks (beams: the running beams')
            reserved = kept if no_evict else self._beams.members(kept)
            if sum(blocks_to_finish(kv, s) for s in reserved) + blocks_to_admit(kv, head, prefix) > free:
                return False
        if no_evict:
            return True
        # max_utilization: the blocks the kept sequences take this step, then the head's first chunk.
        budget = self._config.max_num_tokens
        this_step = sum(kv.blocks_needed(s.seq_id, s.num_computed_tokens + min(s.num_uncomputed_tokens, budget)) for s in kept)
        first_chunk = min(head.num_tokens - prefix.num_tokens, budget)
        return this_step + kv.blocks_needed(head.seq_id, prefix.num_tokens + first_chunk, prefix) <= free

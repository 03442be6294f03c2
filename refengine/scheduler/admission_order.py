"""The order in which waiting sequences are offered a place in the batch, each step.

1. Starved sequences first, oldest first, whatever their priority: those whose request arrived more than
   `EngineConfig.context_starvation_steps` scheduler steps ago (TensorRT-LLM 1.4's context_starvation_iterations;
   0 turns the guard off). Age counts from the request's arrival, also after a preemption, so a preempted sequence
   keeps its place, and with one priority for all the starved ones are exactly the oldest: arrival order is unchanged.
2. Then the others by priority, higher first; within one priority by `EngineConfig.context_scheduling_policy`:
   "fcfs", arrival order (the waiting queue's own order), or "shortest_uncached_first", the fewest tokens still to
   compute (those not found in the prefix cache) first, then arrival order.

Admission walks this order and stops at the first sequence that does not fit, so the head of the order is never
overtaken: a starved sequence is admitted as soon as there is room for it.
"""

from __future__ import annotations

from refengine.config import ContextSchedulingPolicy, EngineConfig
from refengine.kv_cache import KVCacheManager
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.sequence import Sequence


def is_starved(config: EngineConfig, sequence: Sequence, step: int) -> bool:
    """Whether the sequence's request arrived more than `context_starvation_steps` steps before `step`."""
    limit = config.context_starvation_steps
    return limit > 0 and step - sequence.arrival_step > limit


def uncached_tokens(kv: KVCacheManager, sequence: Sequence) -> int:
    """Tokens the sequence would compute if admitted now (its prompt, and output after a preemption, past the cached prefix)."""
    return sequence.num_tokens - kv.find_cached_prefix(sequence.cacheable_token_ids, sequence.prefix_salt).num_tokens


def admission_order(config: EngineConfig, kv: KVCacheManager, waiting: SequenceQueue, step: int) -> list[Sequence]:
    """The waiting sequences in the order they are offered a place at scheduler step `step`."""
    starved = [s for s in waiting if is_starved(config, s, step)]
    others = [s for s in waiting if not is_starved(config, s, step)]
    starved.sort(key=lambda s: (s.arrival_order, s.sample_index))
    if config.context_scheduling_policy is ContextSchedulingPolicy.SHORTEST_UNCACHED_FIRST:
        others.sort(key=lambda s: (-s.priority, uncached_tokens(kv, s), s.arrival_order, s.sample_index))
    return starved + others

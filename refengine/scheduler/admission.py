"""KV-block (and batch-row) arithmetic behind the scheduling policies.

`guaranteed_no_evict` admits a sequence only if the free blocks cover what every running
sequence may still need to reach `max_tokens` plus what the new one needs. The estimates are
upper bounds (a forked sequence is counted as n full sequences), so a running sequence never
finds the cache full under this policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from refengine.kv_cache import CachedPrefix, KVCacheManager
from refengine.scheduler.sequence import Sequence


def blocks_to_finish(kv: KVCacheManager, sequence: Sequence) -> int:
    """Upper bound of the free blocks a running sequence may still take until it finishes."""
    full_size = kv.blocks_for_tokens(sequence.max_total_tokens)
    held = len(kv.block_table(sequence.seq_id))
    if sequence.num_pending_samples > 1:
        return max(0, sequence.num_pending_samples * full_size - held)
    copy_on_write = 1 if kv.shares_last_partial_block(sequence.seq_id) else 0
    return max(0, full_size - held) + copy_on_write


def blocks_to_admit(kv: KVCacheManager, sequence: Sequence, prefix: CachedPrefix) -> int:
    """Upper bound of the free blocks a waiting sequence takes from admission to its end."""
    full_size = kv.blocks_for_tokens(sequence.max_total_tokens)
    already_live = sum(1 for block in prefix.blocks if block.ref_count > 0)
    return max(0, sequence.num_pending_samples * full_size - already_live)


def no_evict_allows(kv: KVCacheManager, running: Iterable[Sequence], candidate: Sequence, prefix: CachedPrefix) -> bool:
    reserved = sum(blocks_to_finish(kv, sequence) for sequence in running)
    return reserved + blocks_to_admit(kv, candidate, prefix) <= kv.num_free_blocks


def batch_slots(sequences: Iterable[Sequence]) -> int:
    """Batch rows the sequences take (a request still to fork into n samples takes n)."""
    return sum(sequence.num_pending_samples for sequence in sequences)


def blocks_for_request(kv_tokens_per_block: int, prompt_len: int, max_tokens: int) -> int:
    """KV blocks one sequence of this request holds at its longest."""
    return -(-(prompt_len + max_tokens) // kv_tokens_per_block)

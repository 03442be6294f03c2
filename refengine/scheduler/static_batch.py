"""Static batching (`EngineConfig.batching="static"`): TensorRT-LLM's V1 batching, as Hugging
Face `generate` batches.

A batch is formed only when none is running: the first waiting requests of the admission order
(`admission_order.py`: starved ones, then higher priority first, then oldest), up to
`max_batch_size` samples, as many as have KV blocks for prompt + max_tokens each (the
`guaranteed_no_evict` reservation). A static batch never preempts, for priority neither: priority
only orders the waiting requests when the next batch is formed. All of them run until the
batch's LONGEST request ends: a request that finishes earlier has its output and finish reason
frozen at once (users see exactly the tokens inflight batching gives), but its sequence stays in
the batch as a padding row. Every step a padding row computes one padding token (its `end_id`,
else token 0) at the position after its frozen tokens, the same slot each step, so it needs no
block beyond its reservation; what it samples is discarded. Only when the last member finishes
are the padding rows' blocks freed and the next batch formed.

Within a step the batch's prompts go first (whole; chunked only if chunked context is on or a
prompt exceeds max_num_tokens), so held rows can never starve a prompt of the token budget;
then every decoding row and every padding row gets one token. Rows skip a step only when
prompts took the whole budget (or when max_batch_size exceeds max_num_tokens).
"""

from __future__ import annotations

from refengine.kv_cache import CachedPrefix, KVCacheManager
from refengine.scheduler.admission import batch_slots, no_evict_allows
from refengine.scheduler.queue import SequenceQueue
from refengine.scheduler.sequence import Sequence, SequenceStatus
from refengine.step_messages import ScheduledSequence

PADDING_TOKEN_ID = 0  # fed to padding rows of requests without an end_id (a pad id, as in `generate`)


def form_batch(kv: KVCacheManager, order: list[Sequence], waiting: SequenceQueue, running: SequenceQueue, max_batch_size: int) -> None:
    """Move the next batch from `waiting` to `running` (which must be empty), in `order` (the waiting
    sequences' admission order), stopping at the first request that does not fit. Members get their
    blocks when their prompt is scheduled; the reservation guarantees the blocks are there."""
    for sequence in order:
        if batch_slots(running) + sequence.num_pending_samples > max_batch_size:
            break
        if not no_evict_allows(kv, running, sequence, kv.find_cached_prefix(sequence.token_ids, sequence.prefix_salt)):
            break
        waiting.remove(sequence)
        sequence.status = SequenceStatus.RUNNING
        running.insert(sequence)


def padding_token(sequence: Sequence) -> int:
    end_id = sequence.params.end_id
    return PADDING_TOKEN_ID if end_id is None else end_id


def padding_row(sequence: Sequence, block_table: tuple[int, ...]) -> ScheduledSequence:
    """One step of a finished sequence held in its batch: a padding token at the position after
    its frozen tokens (the cache holds K/V up to there), sampled like any row and discarded."""
    params = sequence.params
    return ScheduledSequence(
        seq_id=sequence.seq_id,
        new_token_ids=(padding_token(sequence),),
        num_computed_tokens=sequence.num_computed_tokens,
        block_table=block_table,
        num_samples=1,
        sampling_params=params,
        sampling_seed=sequence.sampling_seed,
        first_sample_index=sequence.sample_index,
        num_output_tokens=sequence.num_output_tokens,
        num_prompt_tokens=sequence.num_prompt_tokens,
        token_history=tuple(sequence.token_ids) if params.needs_token_history else (),
    )


def allocate_reserved(kv: KVCacheManager, sequence: Sequence, num_total_tokens: int, prefix: CachedPrefix | None, owner: str | None) -> tuple[int, ...]:
    """Slots within the batch's reservation: running out is a bug of the reservation, not a wait."""
    table = kv.allocate_slots(sequence.seq_id, num_total_tokens, prefix, owner=owner)
    if table is None:
        raise RuntimeError(f"static batch: no KV blocks for sequence {sequence.seq_id} despite its reservation")
    return table


def release_padding_rows(kv: KVCacheManager, padding_rows: SequenceQueue) -> None:
    """The batch has ended: free its held rows' blocks."""
    for sequence in padding_rows:
        kv.free(sequence.seq_id)
        padding_rows.remove(sequence)

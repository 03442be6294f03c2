"""Applying a verified speculative step to a sequence, and rolling back its rejected drafts.

The step computed the sequence's last real token and k draft tokens; the runner returned the
accepted drafts plus the token drawn after them. They join the sequence one by one, exactly as
k + 1 single-token steps would have added them, so a stop sequence, `end_id` or `max_tokens`
reached on the way ends the sequence there and the tokens after it are dropped (never an
overshoot). The K/V written for accepted drafts stay; the rejected drafts' slots are given back
(`KVCacheManager.truncate`), so the cache again holds exactly the computed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceType

from refengine.kv_cache import KVCacheManager
from refengine.scheduler.sequence import FinishReason, Sequence, SequenceUpdate
from refengine.step_messages import SampledToken, ScheduledSequence


def apply_verified(sequence: Sequence, item: ScheduledSequence, samples: SequenceType[SampledToken], kv: KVCacheManager) -> SequenceUpdate:
    num_drafts = len(item.draft_token_ids)
    if not 1 <= len(samples) <= num_drafts + 1:
        raise ValueError(f"runner returned {len(samples)} tokens for sequence {sequence.seq_id} with {num_drafts} drafts")
    num_accepted = len(samples) - 1
    added: list[int] = []
    joined: list[SampledToken] = []
    reason: FinishReason | None = None
    for sample in samples:
        new, reason = sequence.append_sample(sample)
        added.extend(new)
        joined.append(sample)
        if reason is not None:
            break
    # The accepted drafts' K/V were computed in this step, as far as they joined the sequence.
    sequence.num_computed_tokens = min(item.num_total_tokens - num_drafts + num_accepted, sequence.num_tokens)
    kv.truncate(sequence.seq_id, sequence.num_computed_tokens)
    sequence.num_draft_tokens += num_drafts
    sequence.num_accepted_draft_tokens += num_accepted
    return SequenceUpdate(
        seq_id=sequence.seq_id,
        request_id=sequence.request_id,
        sample_index=sequence.sample_index,
        new_token_ids=tuple(added),
        new_samples=tuple(joined[: len(added)]),
        finish_reason=reason,
        num_draft_tokens=num_drafts,
        num_accepted_draft_tokens=num_accepted,
    )

"""The `ScheduledSequence` the scheduler emits for one sequence's share of a step."""

from __future__ import annotations

from refengine.scheduler.sequence import Sequence
from refengine.step_messages import ScheduledSequence


def scheduled_sequence(sequence: Sequence, start: int, end: int, block_table: tuple[int, ...]) -> ScheduledSequence:
    """Tokens [start, end) of `sequence`; it samples when `end` reaches its last token. A guided
    sequence that samples carries its grammar's mask of allowed tokens."""
    reaches_end = end == sequence.num_tokens
    params = sequence.params
    grammar = sequence.grammar
    return ScheduledSequence(
        seq_id=sequence.seq_id,
        new_token_ids=tuple(sequence.token_ids[start:end]),
        num_computed_tokens=start,
        block_table=block_table,
        num_samples=sequence.num_pending_samples if reaches_end else 0,
        sampling_params=params,
        sampling_seed=sequence.sampling_seed,
        first_sample_index=sequence.sample_index,
        num_output_tokens=sequence.num_output_tokens,
        num_prompt_tokens=sequence.num_prompt_tokens,
        token_history=tuple(sequence.token_ids) if reaches_end and params.needs_token_history else (),
        allowed_tokens=grammar.allowed_next() if reaches_end and grammar is not None else None,
        lora=sequence.lora,
    )

"""The BLS's draft-target loop (TensorRT-LLM's tensorrt_llm_bls `_spec_generate`, re-stated): the draft model proposes
up to `num_draft_tokens` tokens, the target (a draft_tokens_external engine) verifies them in one step and returns the
draft tokens it accepts plus one of its own; repeat on the longer sequence until `max_tokens`, the end id, a stop word,
or a step that adds nothing. Pure (the Triton calls are the two functions handed in), importable outside Triton.

`draft(sequence, n)` → up to n draft token ids (the draft model's greedy continuation, request_output_len n);
`target(sequence, draft_ids)` → the token ids the target emits for the sequence given those draft tokens
(request_output_len len(draft_ids) + 1, draft_input_ids draft_ids).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

DraftFn = Callable[[list[int], int], list[int]]
TargetFn = Callable[[list[int], list[int]], list[int]]


@dataclass(frozen=True)
class SpeculativeResult:
    tokens: list[int]  # generated tokens (the prompt excluded), without the end id
    drafted: int  # draft tokens sent to the target
    accepted: int  # of those, the ones the target kept
    target_steps: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def draft_target_generate(
    prompt: Sequence[int],
    max_tokens: int,
    num_draft_tokens: int,
    draft: DraftFn,
    target: TargetFn,
    *,
    end_id: int | None = None,
    stop_words: Sequence[Sequence[int]] = (),
) -> SpeculativeResult:
    output: list[int] = []
    drafted = accepted = steps = 0
    while len(output) < max_tokens:
        sequence = [*prompt, *output]
        # the target adds one token of its own: never draft past max_tokens
        wanted = min(num_draft_tokens, max_tokens - len(output) - 1)
        proposal = list(draft(sequence, wanted))[:wanted] if wanted > 0 else []
        emitted = list(target(sequence, proposal))[: max_tokens - len(output)]
        steps += 1
        drafted += len(proposal)
        accepted += _common_prefix(proposal, emitted)
        if not emitted:
            break
        if end_id is not None and end_id in emitted:
            output.extend(emitted[: emitted.index(end_id)])
            break
        before = len(output)
        output.extend(emitted)
        # the first stop word that ends among the new tokens ends the output there (draft tokens included)
        ends = [end for end in range(before + 1, len(output) + 1) if _ends_with_stop_word(output[:end], stop_words)]
        if ends:
            del output[ends[0] :]
            break
    return SpeculativeResult(output, drafted, accepted, steps)


def _common_prefix(proposal: Sequence[int], emitted: Sequence[int]) -> int:
    count = 0
    for drafted, kept in zip(proposal, emitted):
        if drafted != kept:
            break
        count += 1
    return count


def _ends_with_stop_word(tokens: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    return any(word and len(tokens) >= len(word) and list(tokens[-len(word) :]) == list(word) for word in stop_words)


def use_draft_logits_refusal(wanted: bool | None, *, max_draft_len: int, drafts: bool) -> str | None:
    """Why a request's use_draft_logits cannot be served (None: it can, or it is false or unset): true asks the target
    to accept draft tokens by the draft's logits, so it needs a draft-target engine and a request that drafts."""
    if not wanted:
        return None
    if max_draft_len <= 0:
        return "use_draft_logits: true needs draft-target speculative decoding (build.speculative.mode draft_tokens_external); the engine was built without it"
    if not drafts:
        return "use_draft_logits: true needs num_draft_tokens > 0 (the draft whose logits the target gets)"
    return None


class DraftLogits:
    """use_draft_logits: the draft call's generation logits (one row per draft token, the row it was drawn from), kept
    until the target call that verifies those tokens and sent with them as `draft_logits` (NVIDIA's BLS sends the last
    len(draft tokens) rows of the draft's generation_logits). The loop may cut a draft to the tokens left: the rows are
    cut with it."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._rows = None

    def keep(self, ids: Sequence[int], rows) -> None:
        """`rows` [len(ids), vocab] (an array), or None when the draft model returned no generation_logits."""
        self._ids, self._rows = list(ids), rows

    def for_target(self, draft_ids: Sequence[int]):
        """The rows of `draft_ids` ([k, vocab]), or None for no draft; ValueError when the draft gave none for them."""
        ids, rows = self._ids, self._rows
        self._ids, self._rows = [], None
        if not draft_ids:
            return None
        if rows is None or len(rows) < len(draft_ids) or ids[: len(draft_ids)] != list(draft_ids):
            raise ValueError(
                f"use_draft_logits: the draft model returned {0 if rows is None else len(rows)} generation_logits rows "
                f"for {len(draft_ids)} draft tokens (the draft's tensorrt_llm must return generation_logits)"
            )
        return rows[: len(draft_ids)]

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
            del output[ends[0]:]
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
    return any(word and len(tokens) >= len(word) and list(tokens[-len(word):]) == list(word) for word in stop_words)

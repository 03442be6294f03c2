"""The beam requests the scheduler runs: which sequences are a request's running beams.

A beam request starts as one sequence (its prompt, counted as `beam_width` batch rows and KV
reservations, like an n > 1 request). After the prompt's step it is forked into `beam_width`
sequences that share the prompt's blocks; from then on each step all of them decode together and
`BeamSearch` decides which beam each continues: the scheduler then gives sequence i the tokens
and the block table of its parent (`KVCacheManager.reparent`), so beams share every block up to
where they diverge and copy-on-write splits the last partial one.

Beams are scheduled as a unit, before the other running sequences, and never preempted: under
either policy a beam request is admitted only if the free blocks cover `beam_width` full-length
sequences on top of what the running beams may still take, and when blocks run out a request
without beams is the victim (it is recomputed later). Invariant: every live member of a group is in the running queue;
a group is dropped when its last member finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from refengine.beam_search import BeamSearch, BeamStep
from refengine.guided.beams import follow_parents
from refengine.kv_cache import KVCacheManager
from refengine.scheduler.sequence import FinishReason, Sequence, SequenceUpdate
from refengine.step_messages import SampledToken


@dataclass
class BeamGroup:
    request_id: str
    search: BeamSearch
    member_ids: list[int] = field(default_factory=list)  # running beams' sequence ids, in beam order

    @property
    def width(self) -> int:
        return self.search.beam_width


class BeamGroups:
    def __init__(self) -> None:
        self._groups: dict[str, BeamGroup] = {}
        self._request_of: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, sequence: Sequence) -> BeamGroup:
        params = sequence.params
        search = BeamSearch(
            params.beam_width,
            prompt_len=sequence.num_prompt_tokens,
            max_new_tokens=params.max_tokens,
            length_penalty=params.length_penalty,
            early_stopping=params.early_stopping,
            end_id=params.end_id,
            extra_end_ids=sequence.grammar.stop_token_ids if sequence.grammar is not None else (),
            stop_sequences=params.stop_token_ids,
            min_new_tokens=params.min_tokens,
        )
        group = BeamGroup(sequence.request_id, search, [sequence.seq_id])
        self._groups[sequence.request_id] = group
        self._request_of[sequence.seq_id] = sequence.request_id
        return group

    def add_member(self, group: BeamGroup, seq_id: int) -> None:
        group.member_ids.append(seq_id)
        self._request_of[seq_id] = group.request_id

    def group_of(self, seq_id: int) -> BeamGroup | None:
        request_id = self._request_of.get(seq_id)
        return None if request_id is None else self._groups.get(request_id)

    def is_beam(self, seq_id: int) -> bool:
        return seq_id in self._request_of

    def forget(self, seq_id: int) -> None:
        """A member finished (or was aborted); the group goes with its last member."""
        request_id = self._request_of.pop(seq_id, None)
        group = self._groups.get(request_id) if request_id is not None else None
        if request_id is None or group is None:
            return
        if seq_id in group.member_ids:
            group.member_ids.remove(seq_id)
        if not group.member_ids:
            del self._groups[request_id]

    def members(self, running: Iterable[Sequence]) -> list[Sequence]:
        return [s for s in running if self.is_beam(s.seq_id)]

    def scheduling_order(self, running: Iterable[Sequence]) -> list[Sequence]:
        """Beam members first (oldest group first), then the rest, each in queue order."""
        sequences = list(running)
        return self.members(sequences) + [s for s in sequences if not self.is_beam(s.seq_id)]

    def group_size_at(self, sequence: Sequence) -> int:
        """Tokens a decoding beam group needs this step, at its first member (0 elsewhere)."""
        group = self.group_of(sequence.seq_id)
        if group is None or len(group.member_ids) < 2 or group.member_ids[0] != sequence.seq_id:
            return 0
        return len(group.member_ids)

    def step(self, rows: Mapping[int, torch.Tensor]) -> Iterator[tuple[BeamGroup, BeamStep]]:
        """Run the beam step of every group that computed its beams' rows (seq id -> log-probs)."""
        for request_id in list(dict.fromkeys(self._request_of[seq_id] for seq_id in rows)):
            group = self._groups[request_id]
            missing = [seq_id for seq_id in group.member_ids if seq_id not in rows]
            if missing:
                raise RuntimeError(f"beam request {request_id!r}: no logits for beams {missing} this step")
            yield group, group.search.step(torch.stack([rows[seq_id] for seq_id in group.member_ids]))


def reassign_beams(kv: KVCacheManager, group: BeamGroup, members: list[Sequence], step: BeamStep) -> None:
    """Give member i the block table, the tokens and the grammar state of the beam it continues,
    plus its new token."""
    kv.reparent([(member.seq_id, members[parent].seq_id) for member, parent in zip(members, step.parents)])
    if members[0].grammar is not None:  # a guided request: every member holds its own state (forks fork it)
        grammars = [member.grammar for member in members if member.grammar is not None]
        if len(grammars) != len(members):
            raise RuntimeError(f"beam request {group.request_id!r}: a beam lost its grammar state")
        states = follow_parents(grammars, step.parents, step.tokens)
        for member, state in zip(members, states):
            member.grammar = state
    for member, tokens in zip(members, group.search.running_tokens):
        member.replace_output(tokens)


def _whole_beam(
    group: BeamGroup,
    seq_id: int,
    index: int,
    tokens: tuple[int, ...],
    log_probs: tuple[float, ...],
    cum_log_prob: float,
    with_log_probs: bool,
    finish_reason: FinishReason | None = None,
) -> SequenceUpdate:
    """The update that gives returned sequence `index` a beam whole (with its log-probs when the request asks for them)."""
    samples: tuple[SampledToken, ...] = ()
    if with_log_probs:
        samples = tuple(SampledToken(t, lp) for t, lp in zip(tokens, log_probs))
    return SequenceUpdate(
        seq_id=seq_id,
        request_id=group.request_id,
        sample_index=index,
        new_token_ids=tokens,
        new_samples=samples,
        finish_reason=finish_reason,
        cum_log_prob=cum_log_prob,
        replaces_output=True,
    )


def running_beam_updates(group: BeamGroup, members: list[Sequence]) -> list[SequenceUpdate]:
    """After a step that did not end the search: the best `n` running beams, whole, one update per
    returned sequence (TensorRT-LLM streams every beam in full at each step)."""
    search, params = group.search, members[0].params
    return [
        _whole_beam(
            group,
            members[index].seq_id,
            index,
            search.running_tokens[index],
            search.running_log_probs[index],
            float(search.running_scores[0, index]),
            params.logprobs is not None,
        )
        for index in range(params.n)
    ]


def finish_beams(group: BeamGroup, members: list[Sequence], finish: Callable[[Sequence, FinishReason], None]) -> list[SequenceUpdate]:
    """The request's best `n` beams as one update per returned sequence; every member finishes."""
    params = members[0].params
    updates = [
        _whole_beam(
            group,
            members[min(index, len(members) - 1)].seq_id,
            index,
            beam.token_ids,
            beam.token_log_probs,
            beam.cum_log_prob,
            params.logprobs is not None,
            FinishReason.STOP if beam.stopped else FinishReason.LENGTH,
        )
        for index, beam in enumerate(group.search.best(params.n))
    ]
    for member in members:
        finish(member, FinishReason.STOP)
    return updates

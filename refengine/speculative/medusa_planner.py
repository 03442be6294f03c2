"""Medusa drafting: the heads propose a tree of candidates from the target's own last hidden state, the target
verifies the whole tree in the next step (model_runner/tree_verifier.py).

After every step a Medusa sequence's runner output carries the final hidden state of the row its last token was drawn
from (`return_hidden`); the heads run on it (batched over the step's sequences) when the next step schedules the
sequence's single decode token, and the engine's tree (or the request's own `medusa_choices`) picks the candidates:
node [i_1, ..., i_d] is the i_d-th most likely token of head d - 1. The tree is cut to the step's remaining
`max_num_tokens`, to the tokens left before `max_tokens` (a path of depth d yields d + 1 tokens) and to the KV slots the
sequence can get without preempting anyone, dropping the deepest, least likely nodes first. A guided sequence's tree
loses every node its grammar refuses (given the node's ancestors) with its subtree, and carries the grammar's mask of
each kept node's row. Not drafted: a prefill chunk, the first step of n > 1 samples (they fork after it; each sample is
drafted from its next step on), a request returning context logits. A preempted sequence's hidden state is dropped: it
is drafted again after it has recomputed its tokens.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from refengine.errors import InvalidRequestError
from refengine.sampling import SamplingParams
from refengine.speculative.medusa_heads import MedusaHeads
from refengine.speculative.medusa_tree import MedusaTree, check_medusa_choices, medusa_tree
from refengine.speculative.planner import check_draft_logits
from refengine.step_messages import RunnerOutput, SampledToken, ScheduledSequence, SchedulerOutput

if TYPE_CHECKING:
    from refengine.guided.state import GrammarState
    from refengine.scheduler import Scheduler


class MedusaDrafter:
    has_draft_distribution = False  # deterministic candidates (the heads' top-k)
    description = "Medusa heads' candidates"

    def __init__(self, heads: MedusaHeads, choices: tuple[tuple[int, ...], ...], max_draft_len: int) -> None:
        self.heads = heads
        self.max_draft_len = max_draft_len
        self.tree = medusa_tree(check_medusa_choices(choices, heads.num_heads, max_draft_len, "medusa_choices"))

    def with_choices(self, choices: tuple[tuple[int, ...], ...]) -> MedusaDrafter:
        """The same heads with another engine-wide tree (checked: ValueError naming medusa_choices)."""
        return MedusaDrafter(self.heads, choices, self.max_draft_len)


def check_medusa_request(params: SamplingParams, medusa: MedusaDrafter | None) -> SamplingParams:
    """Refuse by name what a Medusa engine cannot do (beams, external drafts) and a request's `medusa_choices` that do
    not fit the heads; returns the params with the request's tree checked and sorted."""
    if medusa is None:
        if params.medusa_choices is not None:
            raise InvalidRequestError("medusa_choices", "the engine was not built for Medusa (build.speculative.mode: medusa)")
        return params
    if params.beam_width > 1:
        raise InvalidRequestError("beam_width", f"{params.beam_width}: a Medusa engine decodes with beam_width 1 only (as TensorRT-LLM)")
    if params.num_draft_tokens:
        raise InvalidRequestError("num_draft_tokens", f"{params.num_draft_tokens}: a Medusa engine drafts with its own heads, not external drafts")
    if params.medusa_choices is None:
        return params
    try:
        choices = check_medusa_choices(params.medusa_choices, medusa.heads.num_heads, medusa.max_draft_len, "medusa_choices")
    except ValueError as error:
        raise InvalidRequestError("medusa_choices", str(error).removeprefix("medusa_choices: ")) from None
    return dataclasses.replace(params, medusa_choices=choices)


class MedusaSpeculator:
    def __init__(self, drafter: MedusaDrafter, max_num_tokens: int) -> None:
        self.drafter = drafter
        self.max_draft_len = drafter.max_draft_len
        self._max_num_tokens = max_num_tokens
        self._hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (its token count then, last hidden state)
        self._paths: dict[int, tuple[tuple[int, ...], ...]] = {}  # seq_id -> the paths of the tree it verifies this step
        self.node_acceptances: Counter[tuple[int, ...]] = Counter()  # tree path -> times accepted
        self.num_tree_steps = 0  # sequence-steps that verified a tree

    def add_drafts(self, output: SchedulerOutput, scheduler: Scheduler) -> SchedulerOutput:
        self.release(output.preempted_seq_ids + output.finished_seq_ids)
        budget = self._max_num_tokens - output.num_scheduled_tokens
        planned: list[tuple[int, MedusaTree]] = []  # (index in scheduled, tree)
        for index, item in enumerate(output.scheduled):
            sequence = scheduler.get_sequence(item.seq_id)
            stored = self._hidden.get(item.seq_id)
            if budget <= 0 or sequence is None or stored is None or stored[0] != sequence.num_tokens or not _decodes_one(item):
                continue
            tree = self._tree_of(item.sampling_params).cut(budget, item.sampling_params.max_tokens - item.num_output_tokens - 1)
            if tree.num_nodes:
                planned.append((index, tree))
                budget -= tree.num_nodes
        scheduled = [dataclasses.replace(item, return_hidden=True) if _wants_hidden(item) else item for item in output.scheduled]
        if planned:
            top_k = tuple(max(len_k) for len_k in _by_head([tree.top_k for _, tree in planned]))
            hidden = torch.stack([self._hidden[output.scheduled[index].seq_id][1] for index, _ in planned])
            proposals = self.drafter.heads.top_tokens(hidden, top_k)
            for (index, tree), top_tokens in zip(planned, proposals):
                scheduled[index] = self._with_tree(scheduled[index], tree, top_tokens, scheduler)
        copies = output.block_copies + tuple(scheduler.kv_cache.take_block_copies())
        return dataclasses.replace(output, scheduled=tuple(scheduled), block_copies=copies)

    def check_request(self, params: SamplingParams) -> SamplingParams:
        check_draft_logits(params, self)
        return check_medusa_request(params, self.drafter)

    def after_step(self, output: SchedulerOutput, runner_output: RunnerOutput, scheduler: Scheduler) -> None:
        """Keep each running sequence's last hidden state for its next tree, and count the accepted nodes."""
        for item in output.scheduled:
            if item.draft_tree_parents:
                self._count_accepted(item, runner_output.sampled.get(item.seq_id, ()))
        for seq_id, hidden in runner_output.hidden_states.items():
            sequence = scheduler.get_sequence(seq_id)
            if sequence is None:
                self._hidden.pop(seq_id, None)
            else:
                self._hidden[seq_id] = (sequence.num_tokens, hidden.clone())

    def release(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            self._hidden.pop(seq_id, None)
            self._paths.pop(seq_id, None)

    def _tree_of(self, params: SamplingParams) -> MedusaTree:
        return self.drafter.tree if params.medusa_choices is None else medusa_tree(params.medusa_choices)

    def _with_tree(self, item: ScheduledSequence, tree: MedusaTree, top_tokens: list[list[int]], scheduler: Scheduler) -> ScheduledSequence:
        tokens = tree.node_tokens(top_tokens)
        sequence = scheduler.get_sequence(item.seq_id)
        masks = None
        if sequence is not None and sequence.grammar is not None:
            kept, masks = _within_grammar(tree, tokens, sequence.grammar)
            tree, tokens = tree.keep(kept), tuple(tokens[j] for j in kept)
        kv = scheduler.kv_cache
        owner = sequence.request_id if sequence is not None else None
        table = kv.allocate_slots(item.seq_id, item.num_total_tokens + tree.num_nodes, owner=owner) if tree.num_nodes else None
        if table is None and tree.num_nodes:  # no block free: the nodes that fit the blocks it holds
            fits = len(item.block_table) * kv.tokens_per_block - item.num_total_tokens
            tree = tree.cut(fits, tree.max_depth)
            tokens, masks = tokens[: tree.num_nodes], None if masks is None else masks[: tree.num_nodes]
            table = kv.allocate_slots(item.seq_id, item.num_total_tokens + tree.num_nodes, owner=owner) if tree.num_nodes else None
        if table is None:
            return item
        self._paths[item.seq_id] = tree.paths
        return dataclasses.replace(
            item,
            new_token_ids=item.new_token_ids + tokens,
            block_table=table,
            draft_token_ids=tokens,
            draft_tree_parents=tree.parents,
            draft_allowed_tokens=masks,
        )

    def _count_accepted(self, item: ScheduledSequence, samples: tuple[SampledToken, ...]) -> None:
        """Each accepted node's tree path (a node's token is unique among its siblings: the path follows the tokens)."""
        self.num_tree_steps += 1
        paths = self._paths.pop(item.seq_id, ())
        node = -1
        for sample in samples[:-1]:
            node = next(j for j, parent in enumerate(item.draft_tree_parents) if parent == node and item.draft_token_ids[j] == sample.token_id)
            self.node_acceptances[paths[node]] += 1


def _wants_hidden(item: ScheduledSequence) -> bool:
    """Drawing one sample, for a request that may be drafted (no context logits, speculation not turned off by
    num_draft_tokens 0): its last row's hidden state feeds the heads."""
    params = item.sampling_params
    return item.num_samples == 1 and not params.return_context_logits and params.num_draft_tokens != 0


def _decodes_one(item: ScheduledSequence) -> bool:
    """A single decode token of such a request: the step a tree can join."""
    return item.num_new_tokens == 1 and _wants_hidden(item)


def _by_head(top_ks: list[tuple[int, ...]]) -> list[list[int]]:
    depth = max(len(top_k) for top_k in top_ks)
    return [[top_k[h] if h < len(top_k) else 0 for top_k in top_ks] for h in range(depth)]


def _within_grammar(tree: MedusaTree, tokens: tuple[int, ...], grammar: GrammarState) -> tuple[list[int], torch.Tensor | None]:
    """The nodes the grammar allows given their ancestors (a refused node goes with its subtree; so does a stop token,
    after which nothing follows), and the grammar's mask after each kept node; the grammar is left where it was."""
    kept: list[int] = []
    masks = []
    for node, parent in enumerate(tree.parents):
        if parent >= 0 and parent not in kept:
            continue
        path = [node]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        accepted = 0
        for step in reversed(path):
            if grammar.is_stop_token(tokens[step]) or not grammar.accept(tokens[step]):
                break
            accepted += 1
        if accepted == len(path):
            kept.append(node)
            masks.append(grammar.allowed_next())
        grammar.rollback(accepted)
    return kept, torch.stack(masks) if masks else None

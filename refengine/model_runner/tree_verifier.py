"""Verifying a tree of draft tokens (Medusa): the target's half, one forward step (tree_attention.py).

Row 0 is the target's distribution after the root (the last real token), row j + 1 its distribution after node j's
path. Rows are processed exactly as the sampler processes one row (verifier.py: logit bias, bad words, penalties over
the history extended by the node's ancestors, min_tokens, the grammar's mask after them), and the walk starts at the
root:

- greedy: the target's argmax at the current node; if a child carries that token it is accepted and the walk goes on
  from it, else the argmax is the step's last token. The output is plain greedy's, token for token.
- sampled: the candidates are deterministic (the heads' top-k), so at a node with target distribution p and children
  c_1..c_m (in rank order) c_i is accepted with probability p_i(c_i), where p_1 = p and p_{i+1} is p_i with c_i's
  probability removed and renormalised (the residual of rejecting a one-hot draft); on acceptance the walk descends,
  and when every child is rejected the step's last token is drawn from p_{m+1} (SpecInfer's multi-candidate
  speculative sampling for deterministic drafts). Every emitted token is then distributed as p. At a leaf (or the
  end of the accepted path) the token is drawn as plain sampling draws it.

Draws are seeded from (request seed, sample index, position, purpose), so the output does not depend on the batch.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from refengine.model_runner.sampler import apply_logit_processors, draw, draw_seed, sampling_probs, with_logprobs
from refengine.model_runner.verifier import plain_greedy
from refengine.step_messages import SampledToken, ScheduledSequence


def verify_tree(logits: torch.Tensor, item: ScheduledSequence) -> tuple[tuple[SampledToken, ...], tuple[int, ...]]:
    """`logits` [N + 1, vocab] float32 (root, then the nodes): (the accepted nodes' tokens and the token after them;
    the accepted nodes' indices in path order)."""
    nodes, params = item.draft_token_ids, item.sampling_params
    children = _children(item.draft_tree_parents)
    if plain_greedy(item):  # no processor changes a row: every row's argmax at once
        return _walk_argmax(logits.max(dim=-1).indices.tolist(), nodes, children)  # max: ~3x argmax(dim) on CPU, same first-max ties
    first_position = item.num_computed_tokens + 1  # where the token drawn from the root's row goes
    raw_logprobs = torch.log_softmax(logits, dim=-1) if params.logprobs is not None else None
    tokens: list[SampledToken] = []
    path: list[int] = []
    row = 0
    while True:
        processed = apply_logit_processors(logits[row], _at_node(item, path, row))
        position = first_position + len(path)
        if params.is_greedy:
            token_id = int(torch.argmax(processed))
            accepted = next((node for node in children[row] if nodes[node] == token_id), None)
        else:
            token_id, accepted = _multi_candidate_sample(sampling_probs(processed, params), item, children[row], position)
        token = with_logprobs(token_id, None if raw_logprobs is None else raw_logprobs[row], params.logprobs)
        tokens.append(dataclasses.replace(token, logits=logits[row]) if params.return_generation_logits else token)
        if accepted is None:
            return tuple(tokens), tuple(path)
        path.append(accepted)
        row = accepted + 1


@functools.lru_cache(maxsize=256)
def _children(parents: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each row's child nodes in rank order, by row: row 0 the root, row j + 1 node j."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    return tuple(tuple(row) for row in children)


def _walk_argmax(best: list[int], nodes: tuple[int, ...], children: tuple[tuple[int, ...], ...]) -> tuple[tuple[SampledToken, ...], tuple[int, ...]]:
    path: list[int] = []
    row = 0
    while (accepted := next((node for node in children[row] if nodes[node] == best[row]), None)) is not None:
        path.append(accepted)
        row = accepted + 1
    return tuple(SampledToken(nodes[node]) for node in path) + (SampledToken(best[row]),), tuple(path)


def _at_node(item: ScheduledSequence, path: list[int], row: int) -> ScheduledSequence:
    """The item as the sampler would see it after the accepted `path` (row: the path's last node's row)."""
    if not path:
        return item
    history = item.token_history + tuple(item.draft_token_ids[node] for node in path) if item.token_history else ()
    masks = item.draft_allowed_tokens
    allowed = masks[row - 1] if masks is not None else item.allowed_tokens
    return dataclasses.replace(item, num_output_tokens=item.num_output_tokens + len(path), token_history=history, allowed_tokens=allowed)


def _multi_candidate_sample(p: torch.Tensor, item: ScheduledSequence, candidates: tuple[int, ...], position: int) -> tuple[int, int | None]:
    """(token, the accepted candidate node or None)."""
    seed, index = item.sampling_seed, item.first_sample_index
    if not candidates:
        return draw(p, draw_seed(seed, index, position)), None
    residual = p
    for rank, node in enumerate(candidates):
        token_id = item.draft_token_ids[node]
        uniform = float(torch.rand(1, generator=torch.Generator().manual_seed(draw_seed(seed, index, position, f"tree-accept-{rank}"))))
        if uniform < float(residual[token_id]):
            return token_id, node
        residual = residual.clone()
        residual[token_id] = 0.0
        total = float(residual.sum())
        if total <= 0:  # p_i was one-hot on the rejected candidate: impossible (it is accepted surely); stay defined
            return token_id, node
        residual = residual / total
    return draw(residual, draw_seed(seed, index, position, "tree-resample")), None

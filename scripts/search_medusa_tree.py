"""A Medusa tree (`medusa_choices`) for a node budget, from the heads' measured top-k accuracies.

Medusa's sparse-tree construction: a node [i_1, ..., i_d] is the i_1-th most likely token of head 0, then
the i_2-th of head 1, ...; it is accepted when every candidate on its path is right, which is estimated as the
product of the heads' accuracies at those ranks (the heads taken as independent). Exactly one candidate per
depth can be right, so the expected tokens per step is 1 (the base model's own token) plus the sum of the
nodes' acceptance probabilities; greedily adding the most probable node whose parent is already in the tree
maximises it for every budget (a child is never more probable than its parent).

Pure Python: the trainer and the tests use it without torch.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

NodePath = tuple[int, ...]


def rank_accuracies(topk_accuracy: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per head, the probability that its rank-i candidate is the right token: top-(i+1) minus top-i accuracy."""
    ranks = []
    for head, cumulative in enumerate(topk_accuracy):
        if any(later < earlier for earlier, later in zip(cumulative, cumulative[1:])):
            raise ValueError(f"head {head}: top-k accuracies must not decrease with k, got {list(cumulative)}")
        ranks.append([top - below for top, below in zip(cumulative, [0.0, *cumulative[:-1]])])
    return ranks


def path_probability(path: NodePath, ranks: Sequence[Sequence[float]]) -> float:
    probability = 1.0
    for head, rank in enumerate(path):
        probability *= ranks[head][rank]
    return probability


def build_tree(ranks: Sequence[Sequence[float]], budget: int) -> list[list[int]]:
    """The `budget` nodes of largest estimated acceptance, every node's parent in the tree, parents first."""
    available = sum(_nodes_up_to_depth(ranks))
    if not 1 <= budget <= available:
        raise ValueError(f"budget must be 1 to {available} (the nodes the heads' measured ranks allow), got {budget}")
    frontier = [(-ranks[0][rank], (rank,)) for rank in range(len(ranks[0]))]
    heapq.heapify(frontier)
    tree: list[list[int]] = []
    while len(tree) < budget:
        negative, path = heapq.heappop(frontier)
        tree.append(list(path))
        if len(path) < len(ranks):
            head = ranks[len(path)]
            for rank in range(len(head)):
                heapq.heappush(frontier, (negative * head[rank], (*path, rank)))
    return tree


def _nodes_up_to_depth(ranks: Sequence[Sequence[float]]) -> Iterable[int]:
    width = 1
    for head in ranks:
        width *= len(head)
        yield width


def expected_tokens_per_step(tree: Iterable[Sequence[int]], ranks: Sequence[Sequence[float]]) -> float:
    """1 (the base model's token) + the nodes' estimated acceptance probabilities."""
    return 1.0 + sum(path_probability(tuple(node), ranks) for node in tree)


def accepted_depth(nodes: set[NodePath], ranks: Sequence[int]) -> int:
    """The depth of the longest tree path that the right tokens follow (their rank in each head)."""
    depth = 0
    while depth < len(ranks) and tuple(ranks[: depth + 1]) in nodes:
        depth += 1
    return depth


def measured_tokens_per_step(tree: Iterable[Sequence[int]], true_ranks: Iterable[Sequence[int]]) -> float:
    """Mean tokens per step over every position, given per position the rank of the right token in each head."""
    nodes = {tuple(node) for node in tree}
    steps = [1 + accepted_depth(nodes, ranks) for ranks in true_ranks]
    if not steps:
        raise ValueError("no positions to measure the tree on")
    return sum(steps) / len(steps)


def decoded_tokens_per_step(tree: Iterable[Sequence[int]], sequences: Iterable[Sequence[Sequence[int]]], max_tokens: int | None = None) -> float:
    """Tokens per step of greedy Medusa decoding that walks each sequence of consecutive positions' ranks.

    A step whose last context token is at position i emits the base model's token and the accepted path,
    so the next step starts 1 + depth positions later (only the positions decoding visits count); a
    sequence ends with its positions or after `max_tokens` tokens (the last step cut to fit, as a request's
    max_tokens cuts it).
    """
    nodes = {tuple(node) for node in tree}
    tokens = steps = 0
    for ranks in sequences:
        position = emitted = 0
        while position < len(ranks) and (max_tokens is None or emitted < max_tokens):
            step = 1 + accepted_depth(nodes, ranks[position])
            if max_tokens is not None:
                step = min(step, max_tokens - emitted)
            emitted += step
            position += step
            steps += 1
        tokens += emitted
    if not steps:
        raise ValueError("no positions to decode the tree on")
    return tokens / steps

"""The Medusa tree builder (scripts/search_medusa_tree.py): a prefix-closed tree of exactly the node budget that maximises
the estimated tokens per step (checked against every prefix-closed tree of a small case)."""

from __future__ import annotations

import itertools

import pytest

from tests.support.script_modules import import_script

tree_builder = import_script("search_medusa_tree")
# per head, top-k accuracy for k = 1..4 (heads further ahead guess worse)
TOPK = [[0.6, 0.75, 0.82, 0.86], [0.45, 0.6, 0.68, 0.72], [0.35, 0.47, 0.55, 0.6]]


def _prefix_closed(tree) -> bool:
    nodes = {tuple(node) for node in tree}
    return all(tuple(node[:depth]) in nodes for node in tree for depth in range(1, len(node)))


def test_rank_accuracies_are_the_differences_of_the_topk_accuracies():
    ranks = tree_builder.rank_accuracies([[0.5, 0.7, 0.75]])
    assert ranks == [pytest.approx([0.5, 0.2, 0.05])]


def test_topk_accuracies_that_decrease_with_k_are_refused_naming_the_head():
    with pytest.raises(ValueError, match="head 1: top-k accuracies must not decrease"):
        tree_builder.rank_accuracies([[0.5, 0.6], [0.5, 0.4]])


@pytest.mark.parametrize("budget", [1, 2, 5, 8, 16, 32, 63])
def test_the_tree_is_prefix_closed_with_exactly_the_budget_of_distinct_nodes_no_deeper_than_the_heads(budget):
    tree = tree_builder.build_tree(tree_builder.rank_accuracies(TOPK), budget)
    assert len(tree) == budget and len({tuple(node) for node in tree}) == budget
    assert _prefix_closed(tree)
    assert all(1 <= len(node) <= len(TOPK) and all(0 <= rank < 4 for rank in node) for node in tree)
    # parents come first, as TensorRT-LLM's default trees list them
    assert all(tree.index(node[:-1]) < index for index, node in enumerate(tree) if len(node) > 1)


def test_the_tree_maximises_the_estimated_tokens_per_step_over_every_prefix_closed_tree_of_its_size():
    ranks = tree_builder.rank_accuracies([[0.5, 0.8, 0.9], [0.4, 0.55]])
    nodes = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(2)]
    for budget in range(1, len(nodes) + 1):
        best = max(tree_builder.expected_tokens_per_step(subset, ranks) for subset in itertools.combinations(nodes, budget) if _prefix_closed(subset))
        built = tree_builder.build_tree(ranks, budget)
        assert tree_builder.expected_tokens_per_step(built, ranks) == pytest.approx(best)


def test_expected_tokens_per_step_is_one_plus_the_products_of_rank_accuracies_along_each_path():
    ranks = tree_builder.rank_accuracies([[0.5, 0.7], [0.4, 0.6]])  # head 0: 0.5, 0.2; head 1: 0.4, 0.2
    assert tree_builder.expected_tokens_per_step([[0], [1], [0, 0]], ranks) == pytest.approx(1 + 0.5 + 0.2 + 0.5 * 0.4)


def test_measured_tokens_per_step_follows_the_right_tokens_down_the_tree():
    tree = [[0], [1], [0, 0], [0, 0, 2]]
    # per position, the rank of the right token in heads 0, 1, 2
    positions = [(0, 0, 2), (0, 0, 0), (1, 0, 0), (3, 0, 0), (0, 1, 0)]
    assert tree_builder.measured_tokens_per_step(tree, positions) == pytest.approx((4 + 3 + 2 + 1 + 2) / 5)


def test_decoding_visits_only_the_positions_each_step_starts_from_and_stops_at_max_tokens():
    tree = [[0], [0, 0]]
    # steps start at positions 0, 3, 4 and 6, accepting 2, 0, 1 and 2 draft tokens
    sequence = [(0, 0, 5), (9, 9, 9), (9, 9, 9), (1, 0, 0), (0, 3, 0), (9, 9, 9), (0, 0, 0)]
    assert tree_builder.decoded_tokens_per_step(tree, [sequence]) == pytest.approx((3 + 1 + 2 + 3) / 4)
    # max_tokens 5: 3 + 1 + 1 (the third step cut from 2 tokens to the 1 left)
    assert tree_builder.decoded_tokens_per_step(tree, [sequence], max_tokens=5) == pytest.approx(5 / 3)
    # the second sequence: steps at positions 0, 1 and 3 accepting 0, 1 and 2
    assert tree_builder.decoded_tokens_per_step(tree, [sequence, sequence[3:]]) == pytest.approx((9 + 6) / (4 + 3))


def test_a_budget_beyond_the_nodes_the_measured_ranks_allow_is_refused():
    ranks = tree_builder.rank_accuracies([[0.5, 0.7], [0.4, 0.6]])  # 2 + 4 nodes
    with pytest.raises(ValueError, match="budget must be 1 to 6"):
        tree_builder.build_tree(ranks, 7)
    with pytest.raises(ValueError, match="budget must be 1 to 6"):
        tree_builder.build_tree(ranks, 0)

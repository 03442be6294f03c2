"""What verifying a Medusa tree costs on this machine: one target forward over a sequence's root plus N tree nodes
(the forward, the N + 1 logits rows, the tree walk and the accepted K/V's move), against a plain decode step (N = 0),
at batch 1. The ratio bounds Medusa's speed-up: a step accepting a tokens on average yields a + 1 tokens for the cost
of the N-node forward plus the heads (`measure_heads`), so the speed-up is at most (a + 1) * cost(0) / (cost(N) + heads).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch

from refengine.model_runner import DecoderModel, ModelRunner
from refengine.sampling import SamplingParams
from refengine.speculative.medusa_heads import MedusaHeads
from refengine.speculative.medusa_tree import medusa_tree
from refengine.step_messages import ScheduledSequence, SchedulerOutput

TREE_WIDTHS = (10, 6, 4, 3)  # rank choices per depth from which a benchmark tree of N nodes is cut


def benchmark_tree(num_nodes: int, widths: Sequence[int] = TREE_WIDTHS) -> tuple[tuple[int, ...], ...]:
    """A tree of `num_nodes` nodes: the first in (depth, path) order of every path with i_d < widths[d - 1]."""
    paths = [path for depth in range(1, len(widths) + 1) for path in itertools.product(*(range(w) for w in widths[:depth]))]
    return tuple(sorted(paths, key=lambda path: (len(path), path))[:num_nodes])


def measure_tree_verification(
    model: DecoderModel,
    node_counts: Sequence[int],
    context_len: int = 128,
    repeats: int = 20,
    tokens_per_block: int = 32,
) -> list[dict[str, Any]]:
    """Per N: the median wall and CPU milliseconds of one greedy verification step at batch 1 after `context_len`
    cached tokens (over `repeats` rounds that run every N once), and its wall cost relative to N = 0 (a plain decode)."""
    max_nodes = max(node_counts, default=0)
    num_blocks = -(-(context_len + max_nodes + 1) // tokens_per_block)
    runner = ModelRunner(model, num_blocks, tokens_per_block)
    table = tuple(range(num_blocks))
    params = SamplingParams(temperature=0, max_tokens=max_nodes + 2)
    prompt = tuple(index % model.vocab_size for index in range(1, context_len + 1))
    runner.execute(SchedulerOutput(0, (_item(prompt, 0, table, params),)))
    items = []
    for num_nodes in node_counts:
        tree = medusa_tree(benchmark_tree(num_nodes))
        nodes = tuple((7 * j + 3) % model.vocab_size for j in range(tree.num_nodes))
        items.append(_item((5,) + nodes, context_len, table, params, nodes, tree.parents))
    walls: list[list[float]] = [[] for _ in items]
    cpus: list[list[float]] = [[] for _ in items]
    steps = itertools.count(1)
    for round_number in range(repeats + 1):  # rounds interleave the sizes, so a load change on the machine hits all alike
        for index, item in enumerate(items):
            wall, cpu = time.perf_counter(), time.process_time()
            runner.execute(SchedulerOutput(next(steps), (item,)))
            if round_number:  # the first round warms up
                walls[index].append(time.perf_counter() - wall)
                cpus[index].append(time.process_time() - cpu)
    rows = [{"nodes": n, "wall_ms": 1000 * _median(w), "cpu_ms": 1000 * _median(c)} for n, w, c in zip(node_counts, walls, cpus)]
    base = next((row for row in rows if row["nodes"] == 0), rows[0] if rows else None)
    for row in rows:
        row["relative_cost"] = row["wall_ms"] / base["wall_ms"] if base else 1.0
    return rows


def _item(
    tokens: Sequence[int],
    start: int,
    table: tuple[int, ...],
    params: SamplingParams,
    nodes: Sequence[int] = (),
    parents: Sequence[int] = (),
) -> ScheduledSequence:
    return ScheduledSequence(
        seq_id=0,
        new_token_ids=tuple(tokens),
        num_computed_tokens=start,
        block_table=table,
        num_samples=1,
        sampling_params=params,
        sampling_seed=0,
        first_sample_index=0,
        num_output_tokens=0,
        draft_token_ids=tuple(nodes),
        draft_tree_parents=tuple(parents),
    )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def measure_heads(heads: MedusaHeads, hidden_size: int, top_k: Sequence[int], batch_size: int = 1, repeats: int = 20) -> dict[str, Any]:
    """The median wall milliseconds of the heads proposing one step's candidates for `batch_size` sequences."""
    hidden = torch.randn(batch_size, hidden_size, generator=torch.Generator().manual_seed(0))
    walls = []
    for round_number in range(repeats + 1):
        wall = time.perf_counter()
        heads.top_tokens(hidden, top_k)
        if round_number:
            walls.append(time.perf_counter() - wall)
    return {"heads": heads.num_heads, "batch_size": batch_size, "top_k": list(top_k), "wall_ms": 1000 * _median(walls)}

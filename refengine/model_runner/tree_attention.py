"""Tree attention: verifying a tree of draft tokens (Medusa) in one forward over the paged KV cache.

A sequence verifying N tree nodes computes N + 1 rows this step: the root (its last real token) and the nodes, written
to the sequence's next N + 1 slots in that order. Node j sits at position root + depth(j) for RoPE, and sees the cached
prefix, the root and its own ancestors (and itself), never a sibling branch: the tree mask of the step's rows.

After verification only the accepted path stays: its nodes' K/V move to the slots of positions root + 1 .. root + a
(`keep_accepted_kv`), where the next step reads them; the scheduler then truncates the sequence's slots after them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

from refengine.model_runner.attention import AttentionMetadata, TreeRows
from refengine.step_messages import ScheduledSequence


@functools.lru_cache(maxsize=256)
def tree_layout(parents: tuple[int, ...]) -> TreeRows:
    """The rows' depths and mask of a tree given by its nodes' parents (-1: the root; parents before children). Row 0
    is the root, row j + 1 node j."""
    size = len(parents) + 1
    sees = torch.zeros(size, size, dtype=torch.bool)
    sees[:, 0] = True
    depths = [0]
    for node, parent in enumerate(parents):
        row = node + 1
        if parent >= 0:
            sees[row] = sees[parent + 1]
        sees[row, row] = True
        depths.append(depths[parent + 1] + 1)
    return TreeRows(~sees, torch.tensor(depths))


def with_tree(metadata: AttentionMetadata, items: Sequence[ScheduledSequence]) -> AttentionMetadata:
    """The step's metadata with its tree sequences' positions (root + depth) and tree masks."""
    if not any(item.draft_tree_parents for item in items):
        return metadata
    positions = metadata.positions.clone()
    starts = metadata.query_starts()
    masks: list[TreeRows | None] = []
    for index, item in enumerate(items):
        if not item.draft_tree_parents:
            masks.append(None)
            continue
        tree = tree_layout(item.draft_tree_parents)
        depths = tree.depths
        if item.num_new_tokens != len(depths):
            raise ValueError(f"sequence {item.seq_id}: a tree step computes its root and nodes only, got {item.num_new_tokens} rows")
        end = starts[index + 1]
        positions[end - len(depths) : end] = item.num_computed_tokens + depths
        masks.append(tree)
    return dataclasses.replace(metadata, positions=positions, tree_masks=tuple(masks))


def keep_accepted_kv(kv_caches: Sequence[torch.Tensor], item: ScheduledSequence, accepted_nodes: Sequence[int]) -> None:
    """Move the accepted nodes' K/V (node j was written at root + 1 + j) to the slots of root + 1 .. root + a."""
    root = item.num_computed_tokens
    moves = [(root + 1 + node, root + 1 + offset) for offset, node in enumerate(accepted_nodes) if node != offset]
    if not moves or not kv_caches:
        return
    table = item.block_table
    indices: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block size -> (source slots, destination slots)
    for kv_cache in kv_caches:
        _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
        if block_size not in indices:
            slots = [[table[position // block_size] * block_size + position % block_size for position in move] for move in moves]
            indices[block_size] = (torch.tensor([source for source, _ in slots]), torch.tensor([destination for _, destination in slots]))
        sources, destinations = indices[block_size]
        raw = kv_cache.view(torch.uint8) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache  # no float8 index_copy on CPU
        flat = raw.view(2, num_blocks * block_size, num_kv_heads, head_size)
        flat.index_copy_(1, destinations, flat.index_select(1, sources))

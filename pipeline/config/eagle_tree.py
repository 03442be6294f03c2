"""The EAGLE-1/2 tree of the engine target (TensorRT-LLM's `eagle_choices`, the syntax of Medusa's `medusa_choices`) and
what the EAGLE checkpoint's config derives from it (tensorrt_llm/models/eagle/config.py EagleConfig, examples/eagle):

  * num_eagle_layers: the tree's depth ("all EAGLE choices have to have exactly the same depth as num_eagle_layers",
    examples/eagle/README.md): the engine runs one EagleNet per level, each a copy of the one trained draft layer;
  * max_non_leaves_per_layer: the most nodes with children on one level (NVIDIA's convert_checkpoint.py default 10,
    enough for its default tree mc_sim_7b_63);
  * max_draft_len: the tree's nodes (the engine verifies every node of the tree in one step).

Pure Python (light commands check trees).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# NVIDIA's default tree when no eagle_choices is given: mc_sim_7b_63 (examples/eagle/README.md; the tensorrtllm
# backend's model_instance_state.cc warns "Will be using default mc_sim_7b_63 choices" without eagle_choices)
MC_SIM_7B_63 = [
    [0],
    [0, 0],
    [1],
    [0, 1],
    [2],
    [0, 0, 0],
    [1, 0],
    [0, 2],
    [3],
    [0, 3],
    [4],
    [0, 4],
    [2, 0],
    [0, 5],
    [0, 0, 1],
    [5],
    [0, 6],
    [6],
    [0, 7],
    [0, 1, 0],
    [1, 1],
    [7],
    [0, 8],
    [0, 0, 2],
    [3, 0],
    [0, 9],
    [8],
    [9],
    [1, 0, 0],
    [0, 2, 0],
    [1, 2],
    [0, 0, 3],
    [4, 0],
    [2, 1],
    [0, 0, 4],
    [0, 0, 5],
    [0, 0, 0, 0],
    [0, 1, 1],
    [0, 0, 6],
    [0, 3, 0],
    [5, 0],
    [1, 3],
    [0, 0, 7],
    [0, 0, 8],
    [0, 0, 9],
    [6, 0],
    [0, 4, 0],
    [1, 4],
    [7, 0],
    [0, 1, 2],
    [2, 0, 0],
    [3, 1],
    [2, 2],
    [8, 0],
    [0, 5, 0],
    [1, 5],
    [1, 0, 1],
    [0, 2, 1],
    [9, 0],
    [0, 6, 0],
    [0, 0, 0, 1],
    [1, 6],
    [0, 7, 0],
]
# examples/eagle/convert_checkpoint.py --max_non_leaves_per_layer default
DEFAULT_MAX_NON_LEAVES_PER_LAYER = 10


def non_leaves_per_layer(choices: Sequence[Sequence[int]]) -> int:
    """The most nodes on one level that have a child (a node's level is its path's length)."""
    parents = {tuple(path[:-1]) for path in choices if len(path) > 1}
    levels = Counter(len(parent) for parent in parents)
    return max(levels.values(), default=0)


def max_non_leaves(choices: Sequence[Sequence[int]]) -> int:
    """max_non_leaves_per_layer written into the checkpoint: NVIDIA's default, or more when the tree needs more."""
    return max(DEFAULT_MAX_NON_LEAVES_PER_LAYER, non_leaves_per_layer(choices))

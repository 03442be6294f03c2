"""A Medusa tree of choices (TensorRT-LLM's `medusa_choices`): a list of paths, each the tree node reached by taking
the i_1-th most likely token of head 0, then the i_2-th most likely of head 1, ... The tree's root is the token the
model emits this step, not a node; the number of nodes is the engine's max_draft_len.

Pure Python (light commands check trees): refengine.speculative.medusa_tree is the engine's own reading of them.
"""

from __future__ import annotations

from collections.abc import Sequence

Choices = tuple[tuple[int, ...], ...]


def tree_problem(choices: object) -> str | None:
    """Why `choices` is not a tree of choices (None: it is one): a non-empty list of non-empty lists of ints ≥ 0, no
    path twice, every proper prefix of a path also a path (in any order)."""
    if not isinstance(choices, (list, tuple)) or not choices:
        return "must be a non-empty list of paths (lists of ints >= 0), e.g. [[0], [0, 0], [1]]"
    seen: set[tuple[int, ...]] = set()
    for index, path in enumerate(choices):
        if not isinstance(path, (list, tuple)) or not path:
            return f"path {index} ({path!r}) must be a non-empty list of ints >= 0"
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in path):
            return f"path {index} ({list(path)}) must hold ints >= 0 (the rank of a head's token)"
        key = tuple(path)
        if key in seen:
            return f"path {list(key)} is listed twice"
        seen.add(key)
    for path in seen:
        for end in range(1, len(path)):
            if path[:end] not in seen:
                return f"path {list(path)} has no parent: its prefix {list(path[:end])} is not a path of the tree"
    return None


def tree_depth(choices: Sequence[Sequence[int]]) -> int:
    """The heads the tree reads: its deepest path's length."""
    return max(len(path) for path in choices)


def choices_text(choices: Sequence[Sequence[int]]) -> str:
    """NVIDIA's string form (the tensorrt_llm model's medusa_choices parameter): "{0}, {0, 0}, {1}"."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)

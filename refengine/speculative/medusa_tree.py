"""Medusa's tree of candidates: TensorRT-LLM's `medusa_choices`, checked, and the tree the planner schedules.

A choice (a path) [i_1, ..., i_d] is the tree node reached by taking the i_1-th most likely token of head 0, then the
i_2-th most likely of head 1, ...; the tree's root is the token the base model emits this step (not a node). The list
must be prefix-closed (every path's proper prefixes are in it) and free of duplicates; its order does not matter.
Its string form is Triton's `medusa_choices` parameter: `"{0}, {0, 0}, {1}, {0, 1}"`.

A `MedusaTree` keeps the nodes in (depth, path) order, so a parent always comes before its children and a node's
children come in rank order; cutting the list after its first M nodes drops the deepest, least likely nodes first and
leaves the tree prefix-closed. Pure Python: imported by light code paths (no torch), and the one home of the tree's
syntax: the pipeline checks spec trees with `tree_problem` and writes them with `format_medusa_choices`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_PATH = r"\{\s*\d+(?:\s*,\s*\d+)*\s*\}"
_CHOICES = re.compile(rf"\s*{_PATH}(?:\s*,\s*{_PATH})*\s*")


def parse_medusa_choices(text: str, where: str = "medusa_choices") -> tuple[tuple[int, ...], ...]:
    """The paths of NVIDIA's string form `"{0}, {0, 0}, {1}"` (ValueError naming `where` when malformed)."""
    if not isinstance(text, str) or not _CHOICES.fullmatch(text):
        raise ValueError(f'{where}: {text!r:.120} is not a list of paths like "{{0}}, {{0, 0}}, {{1}}" (braces, comma-separated ints)')
    return tuple(tuple(int(index) for index in path.split(",")) for path in re.findall(r"\{([^{}]*)\}", text))


def as_choices(value: Any, where: str = "medusa_choices") -> tuple[tuple[int, ...], ...]:
    """A string (NVIDIA's form) or a list of lists of non-negative ints, as paths (ValueError naming `where`)."""
    if isinstance(value, str):
        return parse_medusa_choices(value, where)
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"{where}: must be a non-empty list of paths (lists of ints), got {value!r:.120}")
    paths = []
    for path in value:
        if isinstance(path, str) or not isinstance(path, Sequence) or not path:
            raise ValueError(f"{where}: {path!r:.60} is not a non-empty list of ints")
        for index in path:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"{where}: {list(path)} holds {index!r}, not a non-negative int")
        paths.append(tuple(path))
    return tuple(paths)


def check_medusa_choices(choices: object, num_heads: int, max_draft_len: int, where: str) -> tuple[tuple[int, ...], ...]:
    """The paths sorted by (depth, path) after checking them against the heads and max_draft_len (ValueError naming
    `where`): no duplicate, every proper prefix present, depth <= num_heads, at most max_draft_len nodes. `choices` is
    unchecked input, as `as_choices` takes it."""
    paths = as_choices(choices, where)
    seen = set(paths)
    if len(seen) != len(paths):
        duplicate = next(path for path in paths if paths.count(path) > 1)
        raise ValueError(f"{where}: path {list(duplicate)} appears more than once")
    for path in paths:
        if len(path) > num_heads:
            raise ValueError(f"{where}: path {list(path)} is {len(path)} deep; the engine has {num_heads} Medusa heads")
        missing = next((path[:d] for d in range(1, len(path)) if path[:d] not in seen), None)
        if missing is not None:
            raise ValueError(f"{where}: path {list(path)} needs its prefix {list(missing)}, which is not in the list")
    if len(paths) > max_draft_len:
        raise ValueError(f"{where}: {len(paths)} nodes exceed max_draft_len {max_draft_len} (one draft token per node)")
    return tuple(sorted(paths, key=lambda path: (len(path), path)))


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


def format_medusa_choices(choices: Sequence[Sequence[int]]) -> str:
    """NVIDIA's string form of the paths."""
    return ", ".join("{" + ", ".join(str(index) for index in path) + "}" for path in choices)


@dataclass(frozen=True)
class MedusaTree:
    """Nodes in (depth, path) order. `parents[j]`: the index of node j's parent (-1: the root); `depths[j]` >= 1;
    `top_k[h]`: how many of head h's most likely tokens the nodes use."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    top_k: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def node_tokens(self, top_tokens: Sequence[Sequence[int]]) -> tuple[int, ...]:
        """Each node's token, from the heads' most likely tokens (`top_tokens[h]`: head h's, most likely first)."""
        return tuple(top_tokens[len(path) - 1][path[-1]] for path in self.paths)

    def cut(self, max_nodes: int, max_depth: int) -> MedusaTree:
        """At most `max_nodes` nodes no deeper than `max_depth` (the deepest, least likely dropped first)."""
        return medusa_tree(tuple(path for path in self.paths if len(path) <= max_depth)[: max(0, max_nodes)])

    def keep(self, kept: Sequence[int]) -> MedusaTree:
        """The tree of the nodes at the indices `kept` (prefix-closed by the caller)."""
        return medusa_tree(tuple(self.paths[j] for j in kept))


@functools.lru_cache(maxsize=256)
def medusa_tree(sorted_paths: tuple[tuple[int, ...], ...]) -> MedusaTree:
    """The tree of prefix-closed paths in (depth, path) order (as `check_medusa_choices` returns them)."""
    index = {path: j for j, path in enumerate(sorted_paths)}
    parents = tuple(index[path[:-1]] if len(path) > 1 else -1 for path in sorted_paths)
    depths = tuple(len(path) for path in sorted_paths)
    top_k = [0] * max(depths, default=0)
    for path in sorted_paths:
        top_k[len(path) - 1] = max(top_k[len(path) - 1], path[-1] + 1)
    return MedusaTree(sorted_paths, parents, depths, tuple(top_k))

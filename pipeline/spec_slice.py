"""A read-only view of the Spec that lets a stage see only the paths its plan entry declares.

A path names a section (`serve`), a field (`build.tp_size`) or a Spec property (`dry_run`). A declared
section lets everything below it through, as the Spec's own objects; a section with only some fields
declared is itself a view. Reading any other path raises UndeclaredSpecRead, so what a stage reads
cannot drift away from what its digest hashes (pipeline.plan.STAGE_DEFS declares both at once).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel


class UndeclaredSpecRead(Exception):
    """A stage read a Spec path that its declaration in plan.STAGE_DEFS leaves out (a bug in the stage or
    the declaration, not in the build config)."""


class SpecSlice:
    __slots__ = ("_target", "_paths", "_owner", "_prefix")

    def __init__(self, target: BaseModel, paths: Iterable[str], *, owner: str, prefix: str = "") -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_paths", frozenset(paths))
        object.__setattr__(self, "_owner", owner)  # the stage, named in the error
        object.__setattr__(self, "_prefix", prefix)  # "" for the Spec, "build." for its build section, ...

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # Python's protocols (copy, pickle, rich) probe for these
            raise AttributeError(name)
        path = self._prefix + name
        if path in self._paths:
            return getattr(self._target, name)
        if any(declared.startswith(path + ".") for declared in self._paths):
            value = getattr(self._target, name)
            if isinstance(value, BaseModel):
                return SpecSlice(value, self._paths, owner=self._owner, prefix=path + ".")
            return value  # an optional section that is absent (None)
        raise UndeclaredSpecRead(
            f"the {self._owner} stage read spec.{path}, which plan.STAGE_DEFS does not declare for it "
            "(declare it where the stage's digest hashes it, or say why it needs no hashing)"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self!r} is read-only")

    def __repr__(self) -> str:
        shown = sorted(path.removeprefix(self._prefix) for path in self._paths if path.startswith(self._prefix))
        return f"SpecSlice({self._owner}: {', '.join(shown)})"

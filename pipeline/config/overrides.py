"""`--set a.b=value` overrides: parse them and apply them to plain config data. Pure functions."""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from pipeline.errors import SpecError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`"build.max_seq_len=2048"` → `(("build", "max_seq_len"), 2048)`. The value is read as a YAML scalar or list."""
    dotted, sep, raw = text.partition("=")
    dotted = dotted.strip()
    if not sep or not dotted:
        raise SpecError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. --set build.max_seq_len=2048")
    path = tuple(dotted.split("."))
    bad = [part for part in path if not _KEY.match(part)]
    if bad:
        raise SpecError(f"--set {text!r}: {bad[0]!r} is not a valid key in {dotted!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "unparsable value"
        raise SpecError(f"--set {text!r}: cannot parse the value {raw!r}: {problem}") from None
    if isinstance(value, dict):
        raise SpecError(f"--set {text!r}: set one field at a time (KEY.PATH=VALUE), not a mapping")
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """Return a copy of `data` with each override applied in order; intermediate mappings are created."""
    result = copy.deepcopy(data)
    for path, value in overrides:
        node = result
        for depth, key in enumerate(path[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                dotted = ".".join(path[: depth + 1])
                raise SpecError(f"--set {'.'.join(path)}=...: {dotted} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result

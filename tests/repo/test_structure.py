"""The project's size and honesty rules (docs/architecture.md#style), checked on the source of every package:
no module past 400 lines, no `assert` standing in for input checking (python -O strips it), no bare
`except`. refengine's own stricter rules (no mutable module globals) are in tests/refengine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "clients", "refengine", "model_repo")
MAX_LINES = 400
MODULES = sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_module_is_small_and_checks_input_honestly(path):
    source = path.read_text(encoding="utf-8")
    lines = len(source.splitlines())
    assert lines <= MAX_LINES, f"{_relative(path)} has {lines} lines (more than {MAX_LINES}): split it by what it does"
    for node in ast.walk(ast.parse(source)):
        assert not isinstance(node, ast.Assert), f"assert in {_relative(path)}:{node.lineno}: raise a named error instead"
        if isinstance(node, ast.ExceptHandler):
            assert node.type is not None, f"bare except in {_relative(path)}:{node.lineno}"

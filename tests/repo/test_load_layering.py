"""The load-test library sits below the stages (docs/architecture.md#layers): the performance gate imports
pipeline.load, which imports neither the stages nor what runs them; the benchmarks' commands
sit above both, so no import (top-level or inside a function) points from stages to bench."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pipeline_imports(path: Path) -> set[str]:
    """Every pipeline module `path` imports, at any depth of the file (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("pipeline.")}


def _offending(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    wrong = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for name in sorted(pipeline_imports(path)):
            if any(name == prefix or name.startswith(prefix + ".") for prefix in forbidden):
                wrong.append(f"{path.relative_to(REPO).as_posix()} imports {name}")
    return wrong


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("pipeline/load", ("pipeline.stages", "pipeline.runner", "pipeline.cli", "pipeline.cli_openai", "bench")),
        ("pipeline/stages", ("bench", "pipeline.runner", "pipeline.cli")),
    ],
)
def test_nothing_below_points_up(folder, forbidden):
    assert _offending(folder, forbidden) == []

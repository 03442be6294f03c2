"""Architecture rules for refengine (docs/architecture.md#reference-engine, docs/architecture.md#style), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "refengine"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_never_imports_pipeline_or_clients(path):
    bad = {n for n in _imports(path) if n.split(".")[0] in ("pipeline", "clients")}
    assert not bad, f"{_relative(path)} imports {bad}"


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [("scheduler", "refengine.model_runner"), ("model_runner", "refengine.scheduler"), ("kv_cache", "refengine.scheduler")],
)
def test_scheduler_and_model_runner_do_not_import_each_other(folder, forbidden):
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        bad = {n for n in _imports(path) if n == forbidden or n.startswith(forbidden + ".")}
        assert not bad, f"{_relative(path)} imports {bad}"


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_modules_stay_small_and_honest(path):
    source = path.read_text()
    tree = ast.parse(source)
    assert len(source.splitlines()) <= 400, f"{_relative(path)} is past 400 lines: split it"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Assert), f"assert in {_relative(path)}:{node.lineno}"
        if isinstance(node, ast.ExceptHandler):
            assert node.type is not None, f"bare except in {_relative(path)}:{node.lineno}"
    for node in tree.body:  # module level: constants only, no mutable globals
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id != "__all__":
                    assert target.id.isupper() or target.id == "TokenLogprob", f"module-level variable {target.id!r} in {_relative(path)}"
                    assert not isinstance(node.value, (ast.List, ast.Dict, ast.Set)), f"mutable module-level {target.id!r} in {_relative(path)}"


def test_public_facade():
    import refengine

    for name in ("LLMEngine", "SamplingParams", "EngineConfig", "EngineLoop", "InvalidRequestError", "ModelLoadError"):
        assert name in refengine.__all__ and hasattr(refengine, name)

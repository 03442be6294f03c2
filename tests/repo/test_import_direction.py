"""The packages' import rules (docs/architecture.md#layers): refengine and clients never import pipeline;
pipeline reaches refengine only through the cpu backend (and the benchmarks that measure it) and
clients only where it calls a served model (the CLI, the benchmarks, the load-test library, the performance
gate). Three exceptions, stdlib-only modules any file may read: refengine's architecture table (the config checks read
it), the Medusa tree's syntax refengine.speculative.medusa_tree (the spec checks and renders trees with it) and
clients.api_keys, the API-key syntax the deploy stage writes into a deployment and the OpenAI front end reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ALLOWED = {
    ("pipeline", "refengine"): ("pipeline/backends/", "bench/"),
    ("pipeline", "clients"): ("pipeline/cli.py", "pipeline/cli_openai.py", "bench/", "pipeline/load/", "pipeline/stages/slo.py"),
}
# Modules that any file of the other package may import: torch-free tables.
SHARED_TABLES = {"refengine.architectures", "refengine.speculative.medusa_tree", "clients.api_keys"}


def imported_packages(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names if alias.name not in SHARED_TABLES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module not in SHARED_TABLES:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ["pipeline", "refengine", "clients"])
def test_imports_between_the_packages_follow_the_rules(package):
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for other in imported_packages(path) & {"pipeline", "refengine", "clients"} - {package}:
            allowed = ALLOWED.get((package, other), ())
            if not relative.startswith(allowed) or not allowed:
                wrong.append(f"{relative} imports {other}")
    assert wrong == []

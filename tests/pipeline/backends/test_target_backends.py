"""The target seam (docs/architecture.md#target-backends): every target has traits and a backend, and nothing outside
pipeline/backends/ (and the traits table) compares the build target."""

from __future__ import annotations

import ast

import pytest

from pipeline.backends.base import TargetBackend
from pipeline.backends.registry import backend_for
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.config.spec import Target
from pipeline.config.targets import traits_of
from pipeline.preflight import preflight
from tests.conftest import REPO

TINY_CPU = REPO / "build_configs" / "tiny-cpu.yaml"
TARGET_VALUES = {target.value for target in Target}
SEAM = ("pipeline/backends/", "pipeline/config/targets.py")


@pytest.mark.parametrize("target", list(Target))
def test_every_target_has_traits_and_a_backend_that_implements_the_interface(target):
    backend = backend_for(target)
    assert backend.target is target
    assert backend.traits == traits_of(target)
    members = set(TargetBackend.__annotations__) | {name for name in vars(TargetBackend) if not name.startswith("_")}
    assert {name for name in members if not hasattr(backend, name)} == set()


def test_a_triton_repository_and_compose_deployment_exist_for_the_runtimes_that_have_them():
    llmapi = backend_for(Target.llmapi)
    assert llmapi.llm_model is None and llmapi.llm_api is not None  # NVIDIA's llmapi layout, not the ensemble
    assert llmapi.compose.profile == "gpu" and llmapi.compose.openai_server_profile == "trtllm-serve"
    assert backend_for(Target.cpu).llm_model.code is not None  # Triton's Python backend runs our model
    assert backend_for(Target.engine).llm_model.code is None  # NVIDIA's C++ tensorrtllm backend
    assert [backend_for(t).llm_api for t in (Target.engine, Target.cpu)] == [None, None]
    assert [backend_for(t).serves_here for t in Target] == [False, True, False]


def test_llmapi_runs_its_build_with_nothing_to_refuse_for_a_plain_spec():
    loaded = load_config(TINY_CPU, ["build.target=llmapi", "build.runner=dry-run"])
    assert preflight(loaded.spec, loaded.model, ["build"]) == []


def test_commands_that_start_triton_here_refuse_a_target_served_elsewhere(tmp_path, capsys):
    code = main(["--artifacts", str(tmp_path), "generate", str(TINY_CPU), "--set", "build.target=engine", "--prompt", "hello"])
    assert code != 0
    assert f"error: generate runs the cpu target here (no TensorRT-LLM on this machine); {TINY_CPU} has build.target 'engine'" in capsys.readouterr().err
    assert not (tmp_path / "tiny-cpu").exists()  # refused before anything is built


def _compares_the_target(node: ast.AST) -> bool:
    def target_side(side):
        if isinstance(side, ast.Attribute) and side.attr == "value":
            side = side.value
        return (isinstance(side, ast.Name) and "target" in side.id.lower()) or (isinstance(side, ast.Attribute) and side.attr == "target")

    def target_value(side):
        if isinstance(side, (ast.Tuple, ast.Set, ast.List)):
            return bool(side.elts) and all(target_value(element) for element in side.elts)
        return (isinstance(side, ast.Constant) and side.value in TARGET_VALUES) or (
            isinstance(side, ast.Attribute) and isinstance(side.value, ast.Name) and side.value.id == "Target"
        )

    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(target_side(side) for side in sides) and any(target_value(side) for side in sides)
    if isinstance(node, ast.Dict):  # a table keyed by target names
        keys = [key for key in node.keys if key is not None]
        return len(keys) > 1 and all(isinstance(key, ast.Constant) and key.value in TARGET_VALUES for key in keys)
    return False


def test_nothing_outside_the_backends_compares_the_build_target():
    found = []
    for path in sorted([*(REPO / "pipeline").rglob("*.py"), *(REPO / "clients").rglob("*.py")]):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(SEAM):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{relative}:{node.lineno}" for node in ast.walk(tree) if _compares_the_target(node)]
    assert found == [], "ask pipeline.backends.registry.backend_for(target) (or config.targets.traits_of) instead"

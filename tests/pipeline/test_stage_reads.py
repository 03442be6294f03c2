"""Each stage reads only what its digest hashes: the stages run on the tiny model (and the GPU examples as dry
runs) with a recording Spec, and every path a stage reads must be hashed by its own digest or an upstream one
(which its digest includes), or be exempt in plan.STAGE_DEFS with the reason. A path read but not hashed
would let a cached artifact be reused after a change it depends on. Also: the declarations themselves."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from rich.console import Console

from pipeline import runner
from pipeline.artifacts import ArtifactStore
from pipeline.config.loader import LoadedConfig, load_config
from pipeline.config.spec import BuildSpec, Spec
from pipeline.plan import STAGE_DEFS, STORE_KEYS, StageDef, stage_def
from pipeline.spec_slice import SpecSlice, UndeclaredSpecRead
from tests.conftest import BUILD_CONFIGS, REPO

WHOLE = "<the whole Spec>"


class RecordingSpec:
    """Wraps a Spec, a SpecSlice or one of their sections and records the dotted path of every value read;
    calling a section's method (model_dump, ...) reads the whole section."""

    def __init__(self, target: Any, log: set[str], path: str = "") -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._target, name)
        path = f"{self._path}.{name}" if self._path else name
        if isinstance(value, (BaseModel, SpecSlice)):
            return RecordingSpec(value, self._log, path)
        if callable(value):
            self._log.add(self._path or WHOLE)
        else:
            self._log.add(path)
        return value


def covered(path: str, prefixes: set[str]) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in prefixes)


@dataclasses.dataclass
class Recorded:
    reads: dict[str, set[str]]  # stage -> paths the stage read
    hashed: dict[str, set[str]]  # stage -> paths its digest's inputs read
    upstream: dict[str, tuple[str, ...]]  # stage -> the planned stages it consumes


def run_recorded(loaded: LoadedConfig, artifacts: Path, until: str | None = None) -> Recorded:
    """Plan and run `loaded` with a recording Spec under every digest's inputs and every stage."""
    facts = runner.gather_facts(loaded)
    the_plan = runner.make_plan(loaded)
    hashed: dict[str, set[str]] = {}
    for planned in the_plan.stages:
        definition = stage_def(planned.name)
        definition.inputs(RecordingSpec(definition.spec_slice(loaded.spec), hashed.setdefault(planned.name, set())), facts)
    reads: dict[str, set[str]] = {}
    stage_function = runner.stage_function

    def recording(name: str):
        run = stage_function(name)
        return lambda ctx: run(dataclasses.replace(ctx, spec=RecordingSpec(ctx.spec, reads.setdefault(name, set()))))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "stage_function", recording)
        runner.run_pipeline(loaded, ArtifactStore(artifacts, loaded.spec.name), until=until, console=Console(quiet=True))
    return Recorded(reads, hashed, {s.name: tuple(s.upstream) for s in the_plan.stages})


def assert_reads_are_hashed(recorded: Recorded) -> None:
    found = unhashed_reads(recorded)
    assert not found, "read but not hashed (hash them in plan.py, or exempt them in STAGE_DEFS with the reason):\n" + "\n".join(
        f"  {stage}: {', '.join(paths)}" for stage, paths in found.items()
    )


def unhashed_reads(recorded: Recorded) -> dict[str, list[str]]:
    """stage -> the paths it read that neither its digest, nor an upstream one, hashes (nor an exemption covers)."""

    def hashed_through(name: str) -> set[str]:
        found = set(recorded.hashed[name])
        for upstream in recorded.upstream[name]:
            found |= hashed_through(upstream)
        return found

    found = {}
    for name, reads in recorded.reads.items():
        allowed = hashed_through(name) | set(stage_def(name).unhashed) | set(STORE_KEYS)
        missing = sorted(path for path in reads if not covered(path, allowed))
        if missing:
            found[name] = missing
    return found


def tiny_config(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("../models/", f"{REPO}/models/").replace("../data/", f"{REPO}/data/"))
    return path


def tiny_cpu(tmp_path: Path) -> Path:
    return tiny_config(tmp_path, "tiny-cpu", (BUILD_CONFIGS / "tiny-cpu.yaml").read_text())


SMALL_CALIBRATION = ("quantize.calibration.num_samples=8", "quantize.calibration.max_seq_len=64")


@pytest.fixture
def fake_load_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The performance gate's server and load sweep (no tritonserver in unit tests). They read spec.deploy only,
    which the slo digest hashes whole."""
    from pipeline.load import serving as serving_module
    from pipeline.load import sweep

    @contextlib.contextmanager
    def serving(repo, deploy, *, model_name, openai, **_):
        yield sweep.Endpoints(grpc="127.0.0.1:1", http="http://127.0.0.1:2", model_name=model_name)

    point = {
        "requests": 10,
        "completed": 10,
        "failed": 0,
        "errors": {},
        "ttft_ms": {"p50": 40.0, "p90": 60.0, "p99": 80.0},
        "itl_ms": {"p50": 10.0, "p90": 12.0, "p99": 14.0},
        "e2e_ms": {"p50": 300.0, "p90": 400.0, "p99": 450.0},
        "output_tokens_per_s": 300.0,
        "requests_per_s": 9.0,
        "good_requests": 10,
        "slo": {"ttft_ms": 2000.0},
    }
    monkeypatch.setattr(serving_module, "serving", serving)
    monkeypatch.setattr(sweep, "run_load_sweep", lambda endpoints, requests, options: {"points": [point], "server_version": "fake"})


@pytest.mark.slow
def test_calibrated_quantization_and_both_gates_read_only_what_their_digests_hash(tmp_path, fake_load_test) -> None:
    gated = (BUILD_CONFIGS / "tiny-cpu-fp8.yaml").read_text() + (BUILD_CONFIGS / "tiny-cpu-slo.yaml").read_text().split("gate:\n", 1)[1]
    path = tiny_config(tmp_path, "gated", gated)
    overrides = (*SMALL_CALIBRATION, "gate.accuracy.num_windows=2", "gate.accuracy.window_len=64")
    first = run_recorded(load_config(path, overrides), tmp_path / "artifacts")
    assert set(first.reads) == {"prepare", "quantize", "build", "gate", "package", "slo", "deploy"}
    assert_reads_are_hashed(first)
    # a second gate of another digest compares with the first one's report, which it finds in the store
    again = run_recorded(load_config(path, (*overrides, "gate.performance.max_regression_pct=150")), tmp_path / "artifacts")
    assert set(again.reads) == {"slo", "deploy"}
    assert_reads_are_hashed(again)
    earlier, later = ArtifactStore(tmp_path / "artifacts", "tiny-cpu-fp8").history("slo")
    regression = json.loads((later.path / "performance.json").read_text())["regression"]
    assert regression["comparable"] and regression["against"] == earlier.digest


@pytest.mark.slow
def test_the_llmapi_quantize_stage_reads_only_what_its_digest_hashes(tmp_path) -> None:
    ungated = (BUILD_CONFIGS / "tiny-cpu-fp8.yaml").read_text().split("gate:\n", 1)[0]
    loaded = load_config(tiny_config(tmp_path, "llmapi", ungated), (*SMALL_CALIBRATION, "build.target=llmapi"))
    recorded = run_recorded(loaded, tmp_path / "artifacts", until="quantize")
    assert set(recorded.reads) == {"prepare", "quantize"}
    assert_reads_are_hashed(recorded)


ENGINE_DRY_RUNS = {
    "fp8 with a performance gate": ("llama-3.1-8b-fp8", "gate.performance.max_regression_pct=10"),
    "int4 awq": ("llama-3.1-8b-int4-awq",),
    "tp2": ("llama-3.3-70b-fp8-tp2",),
    "lora": ("llama-3.1-8b-fp8-lora",),
    "lookahead": ("llama-3.1-8b-fp8-lookahead",),
    "draft-target": ("llama-3.1-8b-fp8-draft-target",),
    "quantized on the cpu": ("mistral-7b-int8-sq", "quantize.device=cpu"),
    "llmapi, both forms": ("llama-3.1-8b-fp8-llmapi",),
}


@pytest.mark.parametrize("case", ENGINE_DRY_RUNS)
def test_engine_dry_runs_read_only_what_their_digests_hash(tmp_path, case) -> None:
    config, *overrides = ENGINE_DRY_RUNS[case]
    loaded = load_config(BUILD_CONFIGS / f"{config}.yaml", ["build.runner=dry-run", *overrides])
    recorded = run_recorded(loaded, tmp_path / "artifacts")
    assert {"prepare", "quantize", "build", "package", "deploy"} <= set(recorded.reads)
    assert_reads_are_hashed(recorded)


def test_a_change_to_the_serve_switches_the_engine_build_checks_rebuilds_it(tmp_path) -> None:
    """trtllm-build's settings carry serve.enable_kv_cache_reuse / enable_chunked_context (the build refuses an
    engine without paged context FMHA for them, and warns about chunked context): the engine build hashes them."""
    from pipeline.plan import EnvFacts, plan

    facts = EnvFacts(tools={}, model_fingerprint="m")
    base = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml", ["build.runner=dry-run"]).spec
    changed = load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml", ["build.runner=dry-run", "serve.enable_chunked_context=false"]).spec
    assert plan(base, facts).stage("build").digest != plan(changed, facts).stage("build").digest
    assert plan(base, facts).stage("quantize").digest == plan(changed, facts).stage("quantize").digest
    cpu = tiny_cpu(tmp_path)
    cpu_base, cpu_changed = load_config(cpu).spec, load_config(cpu, ["serve.enable_chunked_context=false"]).spec
    assert plan(cpu_base, facts).stage("build").digest == plan(cpu_changed, facts).stage("build").digest  # cpu engines ignore them


# -- the declarations -------------------------------------------------------------------------------------
def _section(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def names_a_spec_path(path: str) -> bool:
    model: type[BaseModel] | None = Spec
    for part in path.split("."):
        if model is None:
            return False
        if isinstance(getattr(model, part, None), property):
            return part == path.split(".")[-1]
        if part not in model.model_fields:
            return False
        model = _section(model.model_fields[part].annotation)
    return True


def declared(definition: StageDef) -> list[str]:
    return [*definition.hashes, *definition.via_upstream, *definition.unhashed]


@pytest.mark.parametrize("definition", STAGE_DEFS, ids=lambda d: d.name)
def test_every_declared_path_names_a_spec_field_once(definition: StageDef) -> None:
    paths = declared(definition)
    assert [path for path in paths if not names_a_spec_path(path)] == []
    assert len(paths) == len(set(paths))
    assert all(reason.strip() for reason in definition.unhashed.values())


@pytest.mark.parametrize("definition", STAGE_DEFS, ids=lambda d: d.name)
def test_what_a_stage_takes_from_upstream_an_upstream_digest_hashes(definition: StageDef) -> None:
    def hashed_upstream(name: str) -> set[str]:
        found: set[str] = set()
        for upstream in stage_def(name).upstream:
            found |= set(stage_def(upstream).hashes) | hashed_upstream(upstream)
        return found

    assert [path for path in definition.via_upstream if not covered(path, hashed_upstream(definition.name))] == []


def test_a_slice_lets_through_only_the_declared_paths(tmp_path) -> None:
    spec = load_config(tiny_cpu(tmp_path)).spec
    view = SpecSlice(spec, ("build.tp_size", "serve", "build.lora.max_rank", "dry_run"), owner="test")
    assert view.build.tp_size == 1 and view.serve is spec.serve and view.dry_run is False
    assert view.build.lora is None  # an absent optional section
    assert not isinstance(view.build, BuildSpec)
    for read in (lambda: view.build.pp_size, lambda: view.deploy, lambda: view.build.model_dump()):
        with pytest.raises(UndeclaredSpecRead, match="the test stage read spec.build.pp_size|spec.deploy|spec.build.model_dump"):
            read()
    with pytest.raises(AttributeError):
        view.name = "other"  # type: ignore[misc]


def test_a_stage_that_reads_an_undeclared_field_fails_naming_it(tmp_path, monkeypatch) -> None:
    from pipeline.errors import StageError

    def sneaky(ctx) -> None:
        ctx.spec.serve.model_name  # noqa: B018 - prepare does not declare serve

    path = tiny_cpu(tmp_path)
    monkeypatch.setattr(runner, "stage_function", lambda name: sneaky)
    loaded = load_config(path)
    with pytest.raises(StageError, match=r"prepare failed: UndeclaredSpecRead: the prepare stage read spec.serve"):
        runner.run_pipeline(loaded, ArtifactStore(tmp_path / "artifacts", "tiny-cpu"), until="prepare", console=Console(quiet=True))

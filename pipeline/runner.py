"""Run a plan: reuse verified artifacts, build the rest in order, each stage atomically."""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from pipeline.artifacts import ArtifactRef, ArtifactStore
from pipeline.calibration import calibration_files, file_digests, heldout_files
from pipeline.config.loader import LoadedConfig, format_issues
from pipeline.errors import ArtifactError, PipelineError, SpecError, StageError
from pipeline.hashing import directory_fingerprint
from pipeline.plan import EnvFacts, Plan, StagePlan, plan, stage_def
from pipeline.preflight import preflight
from pipeline.sources import model_repo_sources, package_dir
from pipeline.stages.base import StageContext, StageFn
from pipeline.tools import tool_versions


def stage_function(name: str) -> StageFn:
    """`pipeline.stages.<name>.run`, imported when a stage runs (they import torch, ModelOpt, ...)."""
    import importlib

    stage_def(name)  # KeyError for a name plan.STAGE_DEFS does not define
    return importlib.import_module(f"pipeline.stages.{name}").run


@dataclass(frozen=True)
class StageResult:
    name: str
    outcome: str  # "cached" | "built"
    ref: ArtifactRef
    seconds: float
    note: str = ""


def gather_facts(loaded: LoadedConfig) -> EnvFacts:
    spec = loaded.spec
    calibration = file_digests(calibration_files(spec.quantize.calibration)) if spec.quantize.calibration.files else ""
    heldout = file_digests(heldout_files(spec.gate.accuracy)) if spec.gate.accuracy is not None else ""
    return EnvFacts(
        tools=tool_versions(),
        model_fingerprint=directory_fingerprint(loaded.model.path),
        calibration_fingerprint=calibration,
        heldout_fingerprint=heldout,
        baseline_fingerprint=directory_fingerprint(baseline) if (baseline := _gate_baseline(spec)) is not None else "",
        model_repo_fingerprint=_model_repo_fingerprint(),
        project_fingerprint=_project_fingerprint(),
        lora_fingerprint=_lora_fingerprint(spec),
        draft_fingerprint=_draft_fingerprint(spec),
    )


def _gate_baseline(spec) -> Path | None:
    return spec.gate.accuracy.baseline if spec.gate.accuracy is not None else None


def _draft_fingerprint(spec) -> str:
    """The directory the speculative mode reads, by content: the draft model's, or the Medusa / EAGLE heads'."""
    speculative = spec.build.speculative
    if speculative is None:
        return ""
    for section, key in (("draft", "source"), ("medusa", "heads"), ("eagle", "heads")):
        value = getattr(speculative, section)
        if value is not None:
            return directory_fingerprint(getattr(value, key))
    return ""


def _lora_fingerprint(spec) -> str:
    """The adapters of build.lora, by content and in order (the first one defines the configuration)."""
    if spec.build.lora is None or not spec.build.lora.adapter_dirs:
        return ""
    parts = [directory_fingerprint(Path(directory)) for directory in spec.build.lora.adapter_dirs]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


# The capacity planner's modules: the package stage renders the Python models' instance counts from them.
_PLANNER_MODULES = ("capacity.py", "model_size.py", "spec_capacity.py", "stream_capacity.py")


def _model_repo_fingerprint() -> str:
    """The model code a repository carries and the code that renders it (which files go where, how many instances)."""
    roots = (model_repo_sources(), package_dir("pipeline.render"))
    parts = [directory_fingerprint(root, skip_suffixes=_COMPILED) for root in roots]
    parts += [_file_fingerprint(package_dir("pipeline.backends") / name) for name in _PLANNER_MODULES]
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:32]


def _project_fingerprint() -> str:
    """The project's packages and build files, as the deploy stage copies them into the cpu image."""
    roots = [package_dir(name) for name in ("pipeline", "refengine", "clients")]  # located, not imported
    parts = [directory_fingerprint(root, skip_suffixes=_COMPILED) for root in roots] + [_model_repo_fingerprint()]
    source_root = roots[0].parent
    parts += [_file_fingerprint(source_root / name) for name in ("pyproject.toml", "constraints.txt")]
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:32]


def _file_fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


_COMPILED = (".pyc", ".pyo")


def make_plan(loaded: LoadedConfig) -> Plan:
    return plan(loaded.spec, gather_facts(loaded))


def check_runnable(loaded: LoadedConfig, the_plan: Plan, until: str | None) -> tuple[StagePlan, ...]:
    """The stages a run up to `until` selects; SpecError if any of them cannot run for this spec."""
    if until is not None and until not in the_plan.names():
        raise SpecError(f"--until {until!r}: no such stage; stages: {', '.join(the_plan.names())}")
    selected = the_plan.until(until)
    issues = preflight(loaded.spec, loaded.model, [stage.name for stage in selected])
    if issues:
        raise SpecError(format_issues(issues, loaded.source_map))
    return selected


def artifact_state(store: ArtifactStore, stage: StagePlan) -> str:
    """'built', 'missing' or 'corrupt: <why>' for the artifact a stage plan points at."""
    try:
        return "built" if store.lookup(stage) is not None else "missing"
    except ArtifactError as exc:
        return f"corrupt: {exc.message}"


def run_pipeline(
    loaded: LoadedConfig,
    store: ArtifactStore,
    *,
    until: str | None = None,
    force: bool = False,
    console: Console,
    the_plan: Plan | None = None,
) -> list[StageResult]:
    """`the_plan`: the command's plan, already checked with `check_runnable` (else made and checked here)."""
    if the_plan is None:
        the_plan = make_plan(loaded)
        selected = check_runnable(loaded, the_plan, until)
    else:
        selected = the_plan.until(until)
    results: list[StageResult] = []
    refs: dict[str, ArtifactRef] = {}
    with store.lock():
        for stale in store.remove_stale_temporaries():
            console.print(f"[yellow]removed an unfinished artifact left by an interrupted run:[/yellow] {stale.name}")
        for stage in selected:
            result = _run_stage(loaded, store, stage, refs, force=force, console=console)
            refs[stage.name] = result.ref
            results.append(result)
            _print_result(console, result)
            _stop_on_failed_verdict(result)
    return results


class GateFailed(StageError):
    default_hint = "the artifacts stay for inspection; relax the thresholds in gate.* or change the quantization or build"


def _stop_on_failed_verdict(result: StageResult) -> None:
    notes = result.ref.manifest.get("notes", {})
    if notes.get("verdict") == "failed":
        reasons = "; ".join(notes.get("failures", [])) or "no reason recorded"
        cached = " (cached verdict)" if result.outcome == "cached" else ""
        raise GateFailed(f"{result.name} failed{cached}: {reasons}; report in {result.ref.path}")


def _run_stage(
    loaded: LoadedConfig,
    store: ArtifactStore,
    stage: StagePlan,
    refs: dict[str, ArtifactRef],
    *,
    force: bool,
    console: Console,
) -> StageResult:
    started = time.monotonic()
    note = ""
    if not force:
        try:
            cached = store.lookup(stage)
        except ArtifactError as exc:
            cached = None
            note = "rebuilt: the old artifact failed verification"
            console.print(f"[yellow]{stage.name}: {exc.message}; rebuilding[/yellow]")
        if cached is not None:
            return StageResult(stage.name, "cached", cached, time.monotonic() - started)
    upstream = {name: refs[name] for name in stage.upstream if name in refs}
    with console.status(f"[bold]{stage.name}[/bold]: {stage.summary}"):
        notes: dict = {}
        with store.create(stage, build_name=loaded.spec.name, notes=notes) as out_dir:
            context = StageContext(
                stage_def(stage.name).spec_slice(loaded.spec),
                loaded.model,
                stage,
                upstream,
                out_dir,
                console,
                notes,
                store.path_for(stage),
                history=functools.partial(store.history, stage.name),
            )
            try:
                stage_function(stage.name)(context)
            except PipelineError:
                raise
            except Exception as exc:
                raise StageError(f"stage {stage.name} failed: {type(exc).__name__}: {exc}") from exc
    ref = store.lookup(stage)
    if ref is None:  # pragma: no cover - create() either renames into place or raises
        raise ArtifactError(f"stage {stage.name} finished but {store.path_for(stage)} is missing")
    return StageResult(stage.name, "built", ref, time.monotonic() - started, note)


def _print_result(console: Console, result: StageResult) -> None:
    mark = "[green]✓[/green]" if result.outcome == "built" else "[cyan]=[/cyan]"
    where = _short(result.ref.path)
    extra = f"  [yellow]{result.note}[/yellow]" if result.note else ""
    console.print(f"{mark} {result.name:<9} {result.outcome:<7} {result.seconds:7.2f} s  {where}{extra}")


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

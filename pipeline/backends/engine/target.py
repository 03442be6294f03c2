"""The engine target: a TensorRT-LLM engine built by trtllm-build, served by NVIDIA's C++ `tensorrtllm` backend.

Its build resolves the spec into a trtllm-build invocation and hands it to a runner.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.base import BuildJob, BuiltEngine, ComposeFacts, RuntimeAbilities, TritonLlmModel
from pipeline.backends.engine.build_job import BuildOutcome, run_build
from pipeline.backends.engine.eagle_rules import eagle_problems
from pipeline.backends.engine.runtime import EngineRecord, EngineRuntimeMismatch, RuntimeFacts, check_engine_runtime, probe_runtime
from pipeline.backends.engine.trtllm_build import TrtllmBuild, plan_trtllm_build
from pipeline.backends.engine_facts import EngineFacts
from pipeline.backends.llm_parameters import engine_parameters
from pipeline.config.effective_quantization import effective_quantize
from pipeline.config.gpus import ENGINE_MEMORY_MODEL, RUNTIME_RESERVE_GB, get_gpu
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo, read_model_info
from pipeline.config.spec import ServeSpec, Spec, SpeculativeMode, SpeculativeSpec, Target
from pipeline.config.spec.draft import draft_spec
from pipeline.config.targets import traits_of
from pipeline.container_jobs import DockerRunner, RunnerUnavailable, make_runner
from pipeline.errors import PipelineError, SpecError, StageError
from pipeline.speculative.registry import rules_for
from pipeline.trtllm_versions import get_version, version_for_image


def target_sm(spec: Spec) -> int | None:
    return get_gpu(spec.deploy.gpu.value).compute_capability if spec.deploy.gpu is not None else None


def plan_engine_build(spec: Spec, model: ModelInfo, checkpoint_dir: Path, engine_dir: Path) -> TrtllmBuild:
    version = get_version(spec.build.trtllm_version)
    return plan_trtllm_build(spec, model, checkpoint_dir, engine_dir, version, target_sm(spec), workers=spec.build.workers)


def run_engine_build(spec: Spec, model: ModelInfo, checkpoint_dir: Path, work_dir: Path, final_dir: Path) -> tuple[TrtllmBuild, BuildOutcome]:
    """Build into `work_dir`. A dry run's command names `final_dir` (where the artifact will live), since it is
    meant to be run later on a GPU host; a real build names the directory it really ran in."""
    runner_kind = spec.build.runner.value
    target = final_dir if runner_kind == "dry-run" else work_dir
    build = plan_engine_build(spec, model, checkpoint_dir, target)
    runner = make_runner(runner_kind, image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size)
    outcome = run_build(dataclasses.replace(build, output_dir=work_dir), runner)
    return build, outcome


def engine_preflight(spec: Spec, model: ModelInfo) -> list[Issue]:
    """Everything that can be refused before any stage runs: version profile, runner availability, trtllm-build's rules."""
    try:
        plan_engine_build(spec, model, Path("/nonexistent/checkpoint"), Path("/nonexistent/engine"))
    except SpecError as exc:
        return [(("build",), exc.message)]
    draft = draft_spec(spec)
    if draft is not None:  # the draft's trtllm-build follows the same rules (e.g. FP8 needs SM >= 8.9)
        try:
            plan_engine_build(draft, read_model_info(draft.model.source), Path("/nonexistent/checkpoint"), Path("/nonexistent/engine"))
        except SpecError as exc:
            return [(("build", "speculative", "draft"), f"the draft: {exc.message}")]
    kind = spec.build.runner.value
    if kind == "local" and shutil.which("trtllm-build") is None:
        return [
            (
                ("build", "runner"),
                "build.runner local needs trtllm-build on PATH (TensorRT-LLM 1.2.x on a GPU host); use --runner docker or --runner dry-run",
            )
        ]
    if kind == "docker":
        try:
            DockerRunner(image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size).check_engine()
        except RunnerUnavailable as exc:
            return [(("build", "runner"), f"build.runner docker: {exc.message}")]
    return []


def heads_checkpoint(job: BuildJob) -> Path:
    """The checkpoint trtllm-build reads: for a mode whose trained heads are merged into the model's (medusa, eagle:
    its rules' heads_checkpoint), the quantize stage's with the heads (or EAGLE draft layer) merged in, written beside
    the engine directory; else the quantize stage's as is. A dry-run quantize job leaves no checkpoint yet: the
    dry-run build then logs the command that writes it on the GPU host, and names where it will be."""
    speculative = job.spec.build.speculative
    merged = rules_for(speculative.mode).heads_checkpoint(speculative) if speculative is not None else None
    if speculative is None or merged is None:
        return job.checkpoint_dir
    writer = importlib.import_module(merged.module)
    name, heads, what, options = merged.dir_name, merged.heads, merged.what, dict(merged.options)
    command, write = writer.command, getattr(writer, merged.write)
    work, final = job.engine_dir.parent / name, job.final_engine_dir.parent / name
    if not (job.checkpoint_dir / "config.json").is_file():
        if job.spec.build.runner.value != "dry-run":
            raise StageError(f"build.speculative.{speculative.mode.value}: the quantize stage left no checkpoint in {job.checkpoint_dir}")
        merge = command(job.checkpoint_dir, heads, final, **options)
        job.log(f"dry run: after the quantize job and before trtllm-build, write the {speculative.mode.value} checkpoint: {' '.join(merge)}")
        return final
    if work.exists():
        shutil.rmtree(work)
    write(job.checkpoint_dir, heads, work, **options)
    job.log(f"{speculative.mode.value} checkpoint: {what}, heads from {heads}")
    return final if job.spec.build.runner.value == "dry-run" else work


# -- the engine against the runtime that would serve it ----------------------------------------------
ENGINE_CONFIG_FILE = "config.json"


class EngineMismatchError(PipelineError):
    """The engine was built for another TensorRT-LLM version or GPU than the runtime that would serve it."""

    default_hint = (
        "build the engine with the runtime's TensorRT-LLM version (build.trtllm_version) and for its GPU (deploy.gpu), "
        "or serve it with the image and GPU it was built for"
    )


def declared_engine(spec: Spec) -> EngineRecord:
    """What the spec builds: its version profile and its declared GPU (None when deploy.gpu is unset)."""
    gpu = spec.deploy.gpu.value if spec.deploy.gpu is not None else None
    return EngineRecord(get_version(spec.build.trtllm_version).version, target_sm(spec), gpu)


def recorded_engine(engine_dir: Path, notes: Mapping[str, Any], spec: Spec) -> EngineRecord:
    """What a build artifact recorded: the engine config's `version` (trtllm-build writes the version that
    built it) or the manifest's, and the GPU of the manifest (the spec's declaration for older artifacts)."""
    declared = declared_engine(spec)
    try:
        version = json.loads((engine_dir / ENGINE_CONFIG_FILE).read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        version = None
    version = str(version or notes.get("trtllm_version") or declared.trtllm_version)
    gpu = notes.get("gpu", declared.gpu)
    sm = notes.get("compute_capability")
    if sm is None and gpu is not None:
        sm = get_gpu(gpu).compute_capability
    return EngineRecord(version, int(sm) if sm is not None else None, gpu)


def image_runtime(image: str) -> RuntimeFacts:
    """The TensorRT-LLM version a Triton TRT-LLM image ships, from its tag's profile (unknown for other images)."""
    row = version_for_image(image)
    if row is None:
        return RuntimeFacts()
    return RuntimeFacts(row.version, f"image {image}, Triton {row.triton_tag}")


def host_runtime(spec: Spec) -> RuntimeFacts:
    """This machine: the installed TensorRT-LLM, and the compute capability of the GPUs in deploy.gpus (all if none)."""
    return probe_runtime(spec.deploy.gpus)


def check_before_serving(spec: Spec, engine_dir: Path | None, notes: Mapping[str, Any], runtime: RuntimeFacts | None = None) -> EngineRecord:
    """`serve` on the engine target: the built engine (or, before a build, the one the spec would build)
    against this machine (`runtime`, probed when None); EngineMismatchError names both values."""
    engine = declared_engine(spec) if engine_dir is None else recorded_engine(engine_dir, notes, spec)
    require_compatible(engine, host_runtime(spec) if runtime is None else runtime, where="serve refuses this engine")
    return engine


def require_compatible(engine: EngineRecord, runtime: RuntimeFacts, *, where: str) -> None:
    """Raise EngineMismatchError naming the engine's and the runtime's values (`where`: what was about to start)."""
    try:
        check_engine_runtime(engine, runtime)
    except EngineRuntimeMismatch as mismatch:
        raise EngineMismatchError(f"{where}: {mismatch}") from None


class EngineBackend:
    target = Target.engine
    traits = traits_of(Target.engine)
    serves_here = False  # no TensorRT-LLM on this machine: its Triton runs on a GPU host or in the compose deployment
    triton_version = None  # NGC's Triton image of the TensorRT-LLM version (trtllm_versions: 25.09 or newer)
    llm_api = None
    llm_model = TritonLlmModel(
        template="tensorrt_llm.engine.pbtxt.j2",
        code=None,
        returns_preceding_ids=False,
        always_context_logits=False,  # only from an engine built with gather_context_logits
        runtime=RuntimeAbilities(
            name="the tensorrtllm backend",
            runs_refengine_engines=False,
            other_engine_kind="a cpu-build engine directory has no rank*.engine plans for the tensorrtllm backend",
            weight_suffix=".engine",
            lora=True,
            speculative_decoding=True,
            beam_search=True,
            multiple_ranks=True,
        ),
        takes_draft_tokens=True,
        serves_draft_model=True,
    )
    compose = ComposeFacts(
        profile="gpu",
        health_start_period="900s",  # engine load can take minutes (70B: tens of GB)
        image_has_project=False,  # NGC's image as published
        checks_engine_in_container=True,
        reserves_gpus=True,
        locks_memory=True,
    )

    def preflight(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        return engine_preflight(spec, model)

    def build(self, job: BuildJob) -> dict[str, Any]:
        spec = job.spec
        checkpoint_dir = heads_checkpoint(job)
        build, outcome = run_engine_build(spec, job.model, checkpoint_dir, job.engine_dir, job.final_engine_dir)
        for decision in build.decisions:
            job.log(f"[yellow]{decision.kind}[/yellow] {decision.field}: {decision.requested!r} → {decision.applied!r} ({decision.reason})")
        what = "wrote the trtllm-build command and engine config (dry run)" if outcome.dry_run else "built the engine"
        job.log(f"TensorRT-LLM {build.version.version}: {what}")
        return dict(
            trtllm_version=build.version.version,
            image=build.version.image,
            gpu=spec.deploy.gpu.value if spec.deploy.gpu is not None else None,
            compute_capability=target_sm(spec),  # SM of that GPU (90 = 9.0): `serve` and the container check it
            runner=spec.build.runner.value,
            dry_run=outcome.dry_run,
            command=list(outcome.command),
            decisions=[decision.to_json() for decision in build.decisions],
        )

    def llm_parameters(
        self, facts: EngineFacts, serve: ServeSpec, *, engine_dir: str, gpu_device_ids: Sequence[int], speculative: SpeculativeSpec | None
    ) -> dict[str, str]:
        return engine_parameters(facts, serve, engine_dir=engine_dir, gpu_device_ids=gpu_device_ids, speculative=speculative)

    def server_image(self, spec: Spec) -> tuple[str, str] | None:
        version = get_version(spec.build.trtllm_version)
        note = f"TensorRT-LLM {version.version} profile"
        if version.triton_tag_inferred:
            note += f" (Triton tag {version.triton_tag} inferred, not in NVIDIA's compatibility matrix: verify it)"
        return version.image, note

    def check_serving_host(self, spec: Spec, built: BuiltEngine) -> None:
        engine = built()
        if engine is None:
            check_before_serving(spec, None, {})
        else:
            check_before_serving(spec, *engine)

    def spec_issues(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        speculative = spec.build.speculative
        if speculative is None or speculative.mode is not SpeculativeMode.eagle:
            return []
        quantize = effective_quantize(spec, model.path)
        problems = eagle_problems(
            architecture=model.architecture,
            quant_algo=quantize.algo.value,
            kv_cache_quant=quantize.kv_cache.value,
            pp_size=spec.build.pp_size,
            max_batch_size=spec.build.max_batch_size,
        )
        return [(("build", "speculative", "mode"), problem) for problem in problems]

    def capacity_reserve(self, spec: Spec) -> tuple[float, str]:
        return RUNTIME_RESERVE_GB, ENGINE_MEMORY_MODEL


BACKEND = EngineBackend()

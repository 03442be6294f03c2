"""The engine target's build step: resolve the spec into a trtllm-build invocation and hand it to a runner."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from pipeline.backends.capacity import get_gpu
from pipeline.backends.runners import BuildOutcome, DockerRunner, RunnerUnavailable, make_runner
from pipeline.backends.trtllm_build import TrtllmBuild, plan_trtllm_build
from pipeline.backends.trtllm_versions import get_version
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.errors import SpecError


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
    outcome = runner.run(dataclasses.replace(build, output_dir=work_dir))
    return build, outcome


def engine_preflight(spec: Spec, model: ModelInfo) -> list[Issue]:
    """Everything that can be refused before any stage runs: version profile, runner availability, §1.10 rules."""
    try:
        plan_engine_build(spec, model, Path("/nonexistent/checkpoint"), Path("/nonexistent/engine"))
    except SpecError as exc:
        return [(("build",), exc.message)]
    kind = spec.build.runner.value
    if kind == "local" and shutil.which("trtllm-build") is None:
        return [(("build", "runner"), "build.runner local needs trtllm-build on PATH (TensorRT-LLM 1.2.x on a GPU host); use --runner docker or --runner dry-run")]
    if kind == "docker":
        try:
            DockerRunner(image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size).check_engine()
        except RunnerUnavailable as exc:
            return [(("build", "runner"), f"build.runner docker: {exc.message}")]
    return []

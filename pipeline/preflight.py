"""Checks that a run makes before any stage starts: can the selected stages run here, for this spec?"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from pipeline.backends.registry import backend_for
from pipeline.config.format_rules import needs_calibration
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.config.targets import traits_of
from pipeline.errors import SpecError
from pipeline.quant_formats import weight_format


def preflight(spec: Spec, model: ModelInfo, stages: Iterable[str]) -> list[Issue]:
    selected = set(stages)
    issues: list[Issue] = []
    if "quantize" in selected:
        issues += _quantize_issues(spec, model, build_selected="build" in selected)
    if "build" in selected:
        issues += backend_for(spec.build.target).preflight(spec, model)
    if "slo" in selected and spec.gate.performance is not None:
        issues += _slo_issues(spec, model)
    return issues


def target_issues(spec: Spec, model: ModelInfo) -> list[Issue]:
    """The build target's rules over spec facts (its backend's), reported by `validate` and every command that loads a config."""
    return backend_for(spec.build.target).spec_issues(spec, model)


def _slo_issues(spec: Spec, model: ModelInfo) -> list[Issue]:
    performance = spec.gate.performance
    if performance is None:  # no performance gate: nothing to check
        return []
    if performance.url is None and not backend_for(spec.build.target).serves_here and not spec.dry_run:
        return [
            (
                ("gate", "performance", "url"),
                f"gate.performance serves the packaged repository itself only for the cpu target; for build.target "
                f"{spec.build.target.value!r} set gate.performance.url to the running deployment of this build",
            )
        ]
    if performance.url is None and not spec.dry_run and not any((model.path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        return [(("model", "source"), f"{model.path} has no tokenizer; gate.performance builds its prompts with it")]
    return []


def _quantize_issues(spec: Spec, model: ModelInfo, *, build_selected: bool = False) -> list[Issue]:
    from pipeline.quantization.dispatch import IN_PROCESS, quantize_route

    quantize, weights = spec.quantize, weight_format(spec.quantize.algo)
    if spec.dry_run:  # nothing is calibrated or exported in a dry run
        return []
    route = quantize_route(spec)
    if route == "docker":  # the GPU is in the container: this machine needs only a Docker engine
        if not (build_selected and traits_of(spec.build.target).builds_through_runner):  # else the build's check reports it
            from pipeline.container_jobs import DockerRunner, RunnerUnavailable

            try:
                DockerRunner(image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size).check_engine()
            except RunnerUnavailable as exc:
                return [(("quantize", "device"), f"quantize.device cuda runs the quantize job with build.runner docker: {exc.message}")]
    elif quantize.device.value == "cuda" and not cuda_available():
        where = (
            "with build.runner local ModelOpt calibrates in this process; use --runner docker (the GPU is in the container) "
            "or --runner dry-run, or set quantize.device: cpu"
            if route == "local"
            else f"build.target {spec.build.target.value} quantizes in this process; set quantize.device: cpu"
        )
        return [(("quantize", "device"), f"quantize.device is cuda, but this machine has no CUDA device: {where}")]
    elif weights.calibration_needs_cuda and route in (IN_PROCESS, "local") and not cuda_available():
        return [(("quantize", "algo"), f"{weights.trtllm_quant_algo} calibration needs CUDA kernels, but this machine has no CUDA device")]
    if needs_calibration(quantize):
        from pipeline.calibration import build_calibration_set, load_encoder

        if not any((model.path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            return [(("model", "source"), f"{model.path} has no tokenizer (tokenizer.json or tokenizer.model); calibration needs one")]
        try:
            build_calibration_set(quantize.calibration, *load_encoder(model.path))
        except SpecError as exc:
            return [(("quantize", "calibration", "files"), exc.message)]
    return []


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())

"""Checks that a run makes before any stage starts: can the selected stages run here, for this spec?"""

from __future__ import annotations

from typing import Iterable

from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import QuantAlgo, Spec, Target


def preflight(spec: Spec, model: ModelInfo, stages: Iterable[str]) -> list[Issue]:
    selected = set(stages)
    issues: list[Issue] = []
    if "quantize" in selected and spec.quantize.algo is not QuantAlgo.none:
        issues.append(
            (("quantize", "algo"), f"quantize.algo {spec.quantize.algo.value!r} is not available in this version yet; use algo: none")
        )
    if "build" in selected:
        if spec.build.target is not Target.cpu:
            issues.append(
                (
                    ("build", "target"),
                    f"build.target {spec.build.target.value!r} is not available in this version yet; "
                    "use target: cpu, or run with --until quantize to stop at the TensorRT-LLM checkpoint",
                )
            )
        elif spec.build.tp_size * spec.build.pp_size != 1:
            issues.append(
                (
                    ("build", "tp_size"),
                    f"build.target cpu runs one rank, but build.tp_size ({spec.build.tp_size}) × build.pp_size "
                    f"({spec.build.pp_size}) = {spec.build.tp_size * spec.build.pp_size}; "
                    "use --until quantize to export a sharded checkpoint only",
                )
            )
    return issues

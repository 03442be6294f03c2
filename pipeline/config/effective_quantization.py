"""The quantization a build runs with, decided in one place.

It is the spec's quantize section, except for a pre-quantized model.source that build.target serves as published
(pipeline.config.prequantized_targets: a ModelOpt FP8 / INT4 AWQ / W4A8 AWQ unified checkpoint, with quantize.algo
and quantize.kv_cache none): then it is the format the checkpoint holds. Every choice that depends on the format
reads it here (trtllm-build's FP8 context attention, plugin and paged-context choices, the cpu build's recorded
plugin_config, the format rules, the capacity planner, the accuracy gate's report), so a published FP8 checkpoint is
built exactly as the project's own FP8 quantization of the same model is. Only calibration still reads the spec's
own quantize section: a published checkpoint is not calibrated again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.format_rules import check_format_rules
from pipeline.config.model_info import ModelInfo
from pipeline.config.prequantized import PreQuantized, PreQuantizedError
from pipeline.config.prequantized_targets import published_checkpoint
from pipeline.config.spec import KVCacheQuant, QuantAlgo, QuantizeSpec, Spec

Issue = tuple[tuple[str | int, ...], str]
_LEADING_FIELD = re.compile(r"([a-z_]+(?:\.[a-z_]+)+)")  # the format rules' messages start with the field they are about


def published_format(spec: Spec, source: Path) -> tuple[PreQuantized, str, str] | None:
    """(the declaration, quantize.algo, quantize.kv_cache) of a model.source build.target serves as published; None for
    an unquantized one, and for one it does not serve (validate and the quantize stage refuse those, naming why)."""
    try:
        return published_checkpoint(Path(source), spec.build.target)
    except PreQuantizedError:
        return None


@dataclass(frozen=True)
class Quantization:
    """The fields of the quantize section that name the format: quantize.algo, quantize.kv_cache, quantize.group_size."""

    algo: QuantAlgo
    kv_cache: KVCacheQuant
    group_size: int


def effective_quantize(spec: Spec, source: Path) -> Quantization:
    """spec.quantize's format, or for a checkpoint served as published, the format it holds. Reads build.target and the
    three fields only (a stage's digest hashes them: pipeline.plan)."""
    published = published_format(spec, source)
    if published is None:
        return Quantization(spec.quantize.algo, spec.quantize.kv_cache, spec.quantize.group_size)
    found, algo, kv_cache = published
    return Quantization(QuantAlgo(algo), KVCacheQuant(kv_cache), found.group_size or spec.quantize.group_size)


def format_rule_issues(spec: Spec, info: ModelInfo) -> list[Issue]:
    """The format rules on the quantization the build runs with: a published checkpoint's format (not calibrated), or
    the spec's own (its rules ran when the spec was read, but for the one that waited for the weights' format)."""
    published = published_format(spec, info.path)
    try:
        check_format_rules(_as_section(spec, effective_quantize(spec, info.path)), spec.build, spec.serve, calibrates=published is None)
    except ValueError as exc:
        if published is None:
            field = _LEADING_FIELD.match(str(exc))
            return [(tuple(field.group(1).split(".")) if field else ("quantize", "algo"), str(exc))]
        found, algo, kv_cache = published
        return [
            (
                ("model", "source"),
                f"{found.where}: model.source holds {found.label}, served as published as quantize.algo {algo} with quantize.kv_cache {kv_cache}: {exc}",
            )
        ]
    return []


def _as_section(spec: Spec, quantization: Quantization) -> QuantizeSpec:
    return spec.quantize.model_copy(update={"algo": quantization.algo, "kv_cache": quantization.kv_cache, "group_size": quantization.group_size})

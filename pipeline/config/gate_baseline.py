"""What the accuracy gate scores against: model.source itself, or for a pre-quantized checkpoint served as published,
gate.accuracy.baseline (its quantized codes are no unquantized baseline: read as plain weights they are garbage, and
dequantized they would hide the very error the gate measures).

`validate` refuses a gate on a published checkpoint without a baseline, a baseline on an unquantized model.source (the
gate compares with model.source there), and a baseline that is not the same model unquantized, naming both files.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config.effective_quantization import Issue, published_format
from pipeline.config.model_info import ModelConfigError, ModelInfo, read_model_info
from pipeline.config.prequantized import PreQuantizedError, declared_quantization
from pipeline.config.spec import Spec
from pipeline.config.weight_checks import read_json_object

_WHERE = ("gate", "accuracy", "baseline")
# the ModelInfo fields that make two checkpoints the same model for the gate (one tokenizer, teacher-forced positions)
_SAME_MODEL = ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")


def gate_baseline_issues(spec: Spec, info: ModelInfo) -> list[Issue]:
    gate = spec.gate.accuracy
    if gate is None:
        return []
    published = published_format(spec, info.path)
    if gate.baseline is None:
        if published is None:
            return []
        found = published[0]
        return [
            (
                _WHERE,
                f"gate.accuracy.baseline is not set, but model.source {info.path} is pre-quantized ({found.label}, from "
                f"{found.where}), served as published: its quantized codes are no unquantized baseline to score against; "
                "set gate.accuracy.baseline to the unquantized checkpoint it was quantized from (e.g. the BF16 original), "
                "or remove gate.accuracy",
            )
        ]
    if published is None:
        return [
            (
                _WHERE,
                f"gate.accuracy.baseline is set ({gate.baseline}), but model.source {info.path} is not a pre-quantized "
                "checkpoint served as published: the gate scores the quantized model against model.source itself; "
                "remove gate.accuracy.baseline",
            )
        ]
    return _baseline_model_issues(Path(gate.baseline), info)


def _baseline_model_issues(path: Path, source: ModelInfo) -> list[Issue]:
    try:
        baseline = read_model_info(path)
    except (ModelConfigError, OSError, ValueError) as exc:  # a missing directory or config.json, bad JSON, a bad field
        return [(_WHERE, f"gate.accuracy.baseline: cannot read {path / 'config.json'} ({exc})")]
    config, error = read_json_object(path / "config.json")
    try:
        declared = declared_quantization(path, config) if error is None else None
    except PreQuantizedError as exc:
        return [(_WHERE, f"gate.accuracy.baseline: {exc}")]
    if declared is not None:
        what = f"{declared.label}, from {declared.where}"
        return [(_WHERE, f"gate.accuracy.baseline {path} is itself pre-quantized ({what}); it must be the unquantized checkpoint")]
    if not baseline.weight_files:
        return [(_WHERE, f"gate.accuracy.baseline {path} holds no safetensors weights")]
    for key in _SAME_MODEL:
        ours, theirs = getattr(baseline, key), getattr(source, key)
        if ours != theirs:
            return [
                (
                    _WHERE,
                    f"gate.accuracy.baseline {path / 'config.json'} is not the model of model.source: its {key} is {ours!r}, "
                    f"{source.path / 'config.json'} says {theirs!r}",
                )
            ]
    return []

"""Checks of a Spec against the model it points at (its config.json and file list)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config.effective_quantization import format_rule_issues
from pipeline.config.engine_class_checks import engine_class_issues
from pipeline.config.families import family_of, known_model_types
from pipeline.config.gate_baseline import gate_baseline_issues
from pipeline.config.lora_checks import check_lora_adapters
from pipeline.config.model_info import ModelConfigError, ModelInfo, read_model_info
from pipeline.config.prequantized_targets import prequantized_issues
from pipeline.config.spec import Spec
from pipeline.config.weight_checks import WeightHeaderError, weight_issues, weight_shapes
from pipeline.quant_formats import weight_format

Issue = tuple[tuple[str | int, ...], str]


def inspect_model(spec: Spec) -> tuple[ModelInfo | None, list[Issue]]:
    """Read the model directory; return its facts and every problem found (path in the spec, message)."""
    source = spec.model.source
    where = ("model", "source")
    if not source.exists():
        return None, [(where, f"model directory not found: {source}")]
    if not source.is_dir():
        return None, [(where, f"not a directory: {source} (point it at a Hugging Face checkpoint directory)")]
    if not (source / "config.json").is_file():
        return None, [(where, f"{source} has no config.json; it is not a Hugging Face checkpoint directory")]
    try:
        info = read_model_info(source)
    except ModelConfigError as exc:
        return None, [(where, str(exc))]
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, [(where, f"cannot read {source / 'config.json'}: {type(exc).__name__}: {exc}")]
    return info, check_spec_against_model(spec, info) + _tokenizer_issues(source) + check_draft_model(spec, info)


def check_draft_model(spec: Spec, info: ModelInfo) -> list[Issue]:
    """The draft of draft_tokens_external against its own config.json and the model's (pipeline.config.draft_checks), and
    the trained heads of medusa / eagle / mtp against the model (pipeline.config.heads_checks)."""
    from pipeline.config.draft_checks import draft_issues
    from pipeline.config.heads_checks import speculative_heads_issues

    return draft_issues(spec, info, check_spec_against_model) + speculative_heads_issues(spec, info)


def _tokenizer_issues(source) -> list[Issue]:
    """The tokenizer files serving reads, parsed (as JSON: no tokenizer library needed to validate)."""
    issues: list[Issue] = []
    for name, needs in (("tokenizer.json", "model"), ("tokenizer_config.json", None)):
        path = source / name
        if not path.is_file():
            continue
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            issues.append((("model", "source"), f"{path}: not a readable JSON file ({type(exc).__name__}: {exc})"))
            continue
        if not isinstance(loaded, dict) or (needs is not None and not isinstance(loaded.get(needs), dict)):
            what = f"a JSON object with a {needs!r} object" if needs else "a JSON object"
            issues.append((("model", "source"), f"{path}: not a tokenizer file ({what} expected)"))
    return issues


def check_spec_against_model(spec: Spec, info: ModelInfo) -> list[Issue]:
    issues: list[Issue] = []
    config_file = info.path / "config.json"
    if info.pickle_files and not info.weight_files:
        issues.append(
            (
                ("model", "source"),
                f"{info.path} holds only pickled weights ({', '.join(info.pickle_files)}); "
                "pickles can run code when loaded, so only safetensors are accepted "
                "(convert with `transformers`: model.save_pretrained(dir, safe_serialization=True))",
            )
        )
    issues += family_issues(spec, info)
    build = spec.build
    tp = build.tp_size
    kv_heads_split = info.num_kv_heads % tp == 0 or tp % info.num_kv_heads == 0  # KV heads may be replicated
    if not kv_heads_split or info.num_heads % tp:
        issues.append(
            (
                ("build", "tp_size"),
                f"build.tp_size ({tp}) must divide the model's number of KV heads ({info.num_kv_heads}) "
                f"(or be a multiple of it) and its attention heads ({info.num_heads}), from {config_file} "
                f"(build.target {build.target.value} shards the heads over the tensor-parallel ranks)",
            )
        )
    if info.num_layers % build.pp_size:
        issues.append(
            (
                ("build", "pp_size"),
                f"build.pp_size ({build.pp_size}) must divide the model's number of layers ({info.num_layers}), from {config_file}",
            )
        )
    issues += _check_awq_group_size(spec, info)
    issues += [(("model", "source"), message) for message in _weight_issues(info)]
    issues += prequantized_issues(spec, info)
    issues += format_rule_issues(spec, info)
    issues += gate_baseline_issues(spec, info)
    issues += check_globs(spec)
    issues += check_lora_adapters(spec, info)
    if build.max_seq_len is None:
        deduced = info.default_max_seq_len()
        if build.max_input_len >= deduced:
            issues.append(
                (
                    ("build", "max_input_len"),
                    f"build.max_input_len ({build.max_input_len}) must be less than build.max_seq_len "
                    f"({deduced}, deduced from max_position_embeddings in {config_file})",
                )
            )
    return issues


def family_issues(spec: Spec, info: ModelInfo) -> list[Issue]:
    """The family table's word on this model: known, taken by build.target, in quantize.algo, within its limits."""
    config_file = info.path / "config.json"
    if not info.has_architectures:
        return [
            (("model", "source"), f'{config_file}: architectures is missing; a Hugging Face checkpoint names its model class there (e.g. ["LlamaForCausalLM"])')
        ]
    family = family_of(info.model_type)
    if family is None:
        return [
            (
                ("model", "source"),
                f"{config_file}: model_type {info.model_type!r} ({info.architecture}) is not a family this tool knows; known: {', '.join(known_model_types())}",
            )
        ]
    target, algo = spec.build.target, spec.quantize.algo.value
    refusal = family.target_refusal(target, info.architecture)
    if refusal is not None:
        return [(("build", "target"), f"{refusal} (model_type {info.model_type!r} in {config_file})")]
    issues: list[Issue] = engine_class_issues(spec, info, family)
    why = family.format_refusal(target, algo)
    if why is not None:
        issues.append((("quantize", "algo"), f"quantize.algo {algo} is not built for {family.name} on build.target {target.value}: {why}"))
    max_seq_len, limit = spec.build.max_seq_len or info.default_max_seq_len(), family.max_seq_len_on(target)
    if limit is not None and max_seq_len > limit:
        origin = "build.max_seq_len" if spec.build.max_seq_len else f"max_position_embeddings in {config_file} (build.max_seq_len unset)"
        issues.append(
            (
                ("build", "max_seq_len"),
                f"{family.name} on build.target {target.value} takes at most {limit} tokens, got {max_seq_len} from {origin}: {family.max_seq_len_rule}",
            )
        )
    window = max((w for w in info.layer_windows if w is not None), default=None)
    if window is not None and window > info.max_position_embeddings:
        issues.append(
            (
                ("model", "source"),
                f"{config_file}: sliding_window {window} is larger than max_position_embeddings "
                f"{info.max_position_embeddings}: no sequence is long enough to fill it",
            )
        )
    return issues


def _weight_issues(info: ModelInfo) -> list[str]:
    try:
        return weight_issues(info, weight_shapes(info, logical_only=True))
    except WeightHeaderError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{info.path}: cannot read the safetensors headers ({type(exc).__name__}: {exc})"]


def _check_awq_group_size(spec: Spec, info: ModelInfo) -> list[Issue]:
    group = spec.quantize.group_size
    if not weight_format(spec.quantize.algo).group_wise:
        return []
    for name, size in (("hidden_size", info.hidden_size), ("intermediate_size", info.intermediate_size)):
        if size % group:
            return [
                (
                    ("quantize", "group_size"),
                    f"quantize.group_size ({group}) must divide the model's {name} ({size}) for quantize.algo "
                    f"{spec.quantize.algo.value}, from {info.path / 'config.json'}",
                )
            ]
    return []


def check_globs(spec: Spec) -> list[Issue]:
    """Every calibration and held-out glob must match at least one file."""
    issues: list[Issue] = []
    lists = [(("quantize", "calibration", "files"), spec.quantize.calibration.files)]
    if spec.gate.accuracy is not None:
        lists.append((("gate", "accuracy", "heldout_files"), spec.gate.accuracy.heldout_files))
    for path, patterns in lists:
        for index, pattern in enumerate(patterns):
            if not expand_glob(pattern):
                issues.append((path + (index,), f"no file matches {pattern}"))
    return issues


def expand_glob(pattern: str) -> list[Path]:
    return sorted(p for p in Path("/").glob(pattern.lstrip("/")) if p.is_file())

"""Checks at validate of the trained heads that build.speculative names against the model: Medusa heads (their
config.json, the tensor names and shapes of medusa_lm_head.safetensors from its header, the tree against the heads),
the EAGLE draft checkpoint directory (EAGLE-3, or EAGLE-1/2: pipeline.config.eagle_checks), and the model's own MTP
layers. Headers only: no torch, no safetensors."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.eagle_checks import EAGLE_HEADS, eagle_draft_issues
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec, SpeculativeMode
from pipeline.config.spec.speculative_heads import MEDUSA_CONFIG_FILE, MEDUSA_HEADS_FILE, MedusaSpec, MtpSpec
from pipeline.config.targets import traits_of
from pipeline.config.weight_checks import WeightHeaderError, read_json_object, safetensors_header
from refengine.speculative.medusa_tree import tree_depth

Issue = tuple[tuple[str | int, ...], str]
HEADS = ("build", "speculative", "medusa", "heads")
CHOICES = ("build", "speculative", "medusa", "choices")
_FLOAT_DTYPES = ("F16", "BF16", "F32")


def speculative_heads_issues(spec: Spec, info: ModelInfo) -> list[Issue]:
    speculative = spec.build.speculative
    if speculative is None:
        return []
    if speculative.mode is SpeculativeMode.medusa and speculative.medusa is not None:
        return medusa_issues(speculative.medusa, info)
    if speculative.mode is SpeculativeMode.eagle and speculative.eagle is not None:
        if traits_of(spec.build.target).eagle_generation == "EAGLE-1/2":
            return [(EAGLE_HEADS, message) for message in eagle_draft_issues(speculative.eagle.heads, info, spec.build.tp_size)]
        return _eagle_issues(speculative.eagle.heads, info)
    if speculative.mode is SpeculativeMode.mtp:
        return _mtp_issues(speculative.mtp or MtpSpec(), info)
    return []


def medusa_issues(medusa: MedusaSpec, info: ModelInfo) -> list[Issue]:
    heads = medusa.heads
    if not heads.is_dir():
        return [(HEADS, f"Medusa heads directory not found: {heads}")]
    config, problem = _read_heads_config(heads / MEDUSA_CONFIG_FILE)
    if problem is not None:
        return [(HEADS, problem)]
    weights = heads / MEDUSA_HEADS_FILE
    if not weights.is_file():
        pickled = sorted(p.name for p in heads.glob("*.pt"))
        why = f" ({', '.join(pickled)} are pickles, which can run code when loaded: only safetensors are accepted)" if pickled else ""
        return [(HEADS, f"{heads} has no {MEDUSA_HEADS_FILE}{why}")]
    try:
        header = safetensors_header(weights)
    except (OSError, WeightHeaderError) as exc:
        return [(HEADS, str(exc))]
    num_heads, num_layers = config["medusa_num_heads"], config["medusa_num_layers"]
    issues: list[Issue] = [(HEADS, message) for message in _config_issues(config, heads, info)]
    issues += [(HEADS, message) for message in _tensor_issues(header, weights, num_heads, num_layers, info)]
    depth = tree_depth(medusa.tree)
    if depth > num_heads:
        deepest = next(path for path in medusa.tree if len(path) == depth)
        issues.append(
            (
                CHOICES,
                (
                    f"build.speculative.medusa.choices path {deepest} is {depth} deep: it reads head {depth - 1}, which does not "
                    f"exist (the heads in {heads} are {num_heads}: heads 0..{num_heads - 1}, medusa_num_heads in {heads / MEDUSA_CONFIG_FILE})"
                ),
            )
        )
    return issues


def _read_heads_config(path: Path) -> tuple[dict, str | None]:
    config, problem = read_json_object(path)
    if problem is not None:
        return {}, f"the heads' {problem}"
    for key in ("medusa_num_heads", "medusa_num_layers"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return {}, f"{path} {key} must be an int >= 1, got {value!r}"
    return config, None


def _config_issues(config: dict, heads: Path, info: ModelInfo) -> list[str]:
    config_file = heads / MEDUSA_CONFIG_FILE
    issues = []
    for key, model_value in (("hidden_size", info.hidden_size), ("vocab_size", info.vocab_size)):
        value = config.get(key)
        if value is not None and value != model_value:
            issues.append(
                f"{config_file} {key} ({value}) differs from the model's ({model_value}, {info.path / 'config.json'}): the heads were trained on another model"
            )
    act = config.get("medusa_hidden_act", "silu")
    if act != "silu":
        issues.append(f"{config_file} medusa_hidden_act {act!r}: the Medusa heads TensorRT-LLM and refengine run use silu")
    return issues


def _tensor_issues(header: dict, weights: Path, num_heads: int, num_layers: int, info: ModelInfo) -> list[str]:
    hidden, vocab = info.hidden_size, info.vocab_size
    expected: dict[str, list[int]] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            expected[f"{h}.{layer}.linear.weight"] = [hidden, hidden]
            expected[f"{h}.{layer}.linear.bias"] = [hidden]
        expected[f"{h}.{num_layers}.weight"] = [vocab, hidden]
    issues = []
    for key, shape in expected.items():
        entry = header.get(key)
        if not isinstance(entry, dict):
            issues.append(f"{weights} has no tensor {key} (medusa_num_heads {num_heads}, medusa_num_layers {num_layers} in the heads' config.json)")
            continue
        if entry.get("shape") != shape:
            issues.append(f"{weights} {key} has shape {entry.get('shape')}, expected {shape} (the model's hidden_size {hidden}, vocab_size {vocab})")
        if entry.get("dtype") not in _FLOAT_DTYPES:
            issues.append(f"{weights} {key} has dtype {entry.get('dtype')}: Medusa heads are float16, bfloat16 or float32")
    extra = sorted(key for key in header if key != "__metadata__" and key not in expected)
    if extra:
        issues.append(
            f"{weights} holds tensors the heads' config.json does not describe ({', '.join(extra[:4])}"
            f"{', ...' if len(extra) > 4 else ''}): medusa_num_heads {num_heads} and medusa_num_layers {num_layers} "
            "must match the file"
        )
    return issues


def _eagle_issues(heads: Path, info: ModelInfo) -> list[Issue]:
    where = EAGLE_HEADS
    config, problem = read_json_object(heads / "config.json")
    if problem is not None:
        return [(where, f"{heads} is not an EAGLE-3 draft checkpoint directory: {problem}")]
    if not any(heads.glob("*.safetensors")):
        return [(where, f"{heads} has no *.safetensors (only safetensors are accepted)")]
    hidden = config.get("hidden_size")
    if hidden is not None and hidden != info.hidden_size:
        return [
            (
                where,
                f"{heads / 'config.json'} hidden_size ({hidden}) differs from the model's ({info.hidden_size}): an "
                "EAGLE-3 layer reads the model's hidden states, so it must be trained for this model",
            )
        ]
    return []


def _mtp_issues(mtp: MtpSpec, info: ModelInfo) -> list[Issue]:
    layers = info.text_config.get("num_nextn_predict_layers") or 0
    if layers >= mtp.num_nextn_predict_layers:
        return []
    return [
        (
            ("build", "speculative", "mode"),
            (
                f"build.speculative.mode mtp needs the model's own multi-token-prediction layers: {info.path / 'config.json'} "
                f"num_nextn_predict_layers is {layers}, below build.speculative.mtp.num_nextn_predict_layers "
                f"({mtp.num_nextn_predict_layers}) (MTP is trained into DeepSeek-V3-family checkpoints)"
            ),
        )
    ]

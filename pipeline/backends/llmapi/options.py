"""The llmapi target's one table: each spec field → the one `LLM()` option (TorchLlmArgs) it sets.

Both forms read the same options: the Triton `llmapi` model's `tensorrt_llm/1/model.yaml` (whose keys are
`LLM()` arguments, plus `triton_config`) and trtllm-serve's `--extra_llm_api_options` YAML. The build stage
writes the rows of stage "build" (they are hashed with build.*), the package stage adds the rows of stage
"serve". A field without an option on the PyTorch path is refused when it is set away from its default,
naming the field, the target and why (ROWS' `why_not`).

build.speculative.mode maps to one speculative_config (its rules in pipeline/speculative/) or is refused with the reason;
build.lora and serve.lora map to lora_config and peft_cache_config (pipeline.backends.llmapi.lora).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from pipeline.backends.attention_windows import window_vector
from pipeline.backends.llmapi.lora import lora_option_fields, lora_options
from pipeline.backends.llmapi.versions import LlmapiVersion, check_value, get_llmapi_version
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec, SpeculativeSpec
from pipeline.errors import SpecError
from pipeline.speculative.draft_target import DRAFT_TARGET
from pipeline.speculative.eagle import EAGLE3
from pipeline.speculative.registry import registered_modes, rules_for

TARGET = "build.target llmapi"
# Recorded decisions (no spec field): NVIDIA's template names the backend; CUDA graphs stay on (TorchLlmArgs'
# default CudaGraphConfig) with padding, which NVIDIA's field description calls "usually a net win".
FIXED_OPTIONS: Mapping[str, Any] = {"backend": "pytorch", "cuda_graph_config.enable_padding": True}

_KV_DTYPES = {"none": "auto", "fp8": "fp8"}  # quantize.kv_cache -> kv_cache_config.dtype ("auto": the checkpoint's)
_POLICIES = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


@dataclass(frozen=True)
class Row:
    spec_field: str  # dotted path in the spec
    option: str | None  # dotted LLM() option; None: the PyTorch path has none (refused unless at its default)
    stage: str  # "build" | "serve": which stage writes it
    engine: str  # what the engine target sets from the field (the side-by-side table of docs/targets.md)
    value: Callable[[Any], Any] = _plain
    why_not: str = ""


ROWS: tuple[Row, ...] = (
    Row("model.dtype", "dtype", "build", "checkpoint dtype (ModelOpt export)"),
    Row("build.tp_size", "tensor_parallel_size", "build", "checkpoint mapping tp_size"),
    Row("build.pp_size", "pipeline_parallel_size", "build", "checkpoint mapping pp_size"),
    Row("build.max_batch_size", "max_batch_size", "build", "--max_batch_size"),
    Row("build.max_input_len", "max_input_len", "build", "--max_input_len"),
    Row("build.max_seq_len", "max_seq_len", "build", "--max_seq_len"),  # resolved to the model's default when unset
    Row("build.max_num_tokens", "max_num_tokens", "build", "--max_num_tokens"),
    Row("build.max_beam_width", "max_beam_width", "build", "--max_beam_width"),
    Row("build.tokens_per_block", "kv_cache_config.tokens_per_block", "build", "--tokens_per_block"),
    Row("quantize.kv_cache", "kv_cache_config.dtype", "build", "checkpoint kv_cache_quant_algo", lambda v: _KV_DTYPES[_plain(v)]),
    Row("serve.kv_cache_free_gpu_mem_fraction", "kv_cache_config.free_gpu_memory_fraction", "serve", "kv_cache_free_gpu_mem_fraction"),
    Row("serve.enable_kv_cache_reuse", "kv_cache_config.enable_block_reuse", "serve", "enable_kv_cache_reuse"),
    Row("serve.enable_chunked_context", "enable_chunked_prefill", "serve", "enable_chunked_context"),
    Row("serve.batch_scheduler_policy", "scheduler_config.capacity_scheduler_policy", "serve", "batch_scheduler_policy", lambda v: _POLICIES[_plain(v)]),
    Row("serve.guided_decoding", "guided_decoding_backend", "serve", "guided_decoding_backend", lambda v: GUIDED_DECODING_BACKENDS[_plain(v)]),
    Row("serve.stream_interval", "stream_interval", "serve", "none: the tensorrtllm backend streams every token (refused above 1)"),
    Row("build.kv_cache_type", None, "build", "--kv_cache_type", why_not="the PyTorch backend always runs a paged KV cache (KvCacheConfig has no cache type)"),
    Row("build.opt_num_tokens", None, "build", "--opt_num_tokens", why_not="it tunes a TensorRT optimization profile; there is no engine"),
    Row("build.workers", None, "build", "--workers", why_not="it is trtllm-build's parallel build; nothing is built"),
    Row(
        "build.gather_context_logits",
        None,
        "build",
        "--gather_context_logits",
        why_not="TorchLlmArgs has no gather_context_logits (prompt log-probs are per request: SamplingParams.prompt_logprobs)",
    ),
    Row("build.plugins", None, "build", "--*_plugin, --context_fmha, ...", why_not="they are trtllm-build plugin switches; the PyTorch backend has no plugins"),
    Row("serve.model_name", None, "serve", "the ensemble's name", why_not="NVIDIA's llmapi layout has one model, tensorrt_llm, which clients call"),
    Row(
        "serve.instances.tensorrt_llm",
        None,
        "serve",
        "instance_group count",
        why_not="one LLM() instance per server is rendered (NVIDIA's multi-instance mode needs gpu_device_ids per instance)",
    ),
    Row(
        "serve.max_queue_delay_microseconds",
        None,
        "serve",
        "dynamic_batching max_queue_delay_microseconds",
        why_not="NVIDIA's llmapi model runs without Triton batching (max_batch_size 0): the LLM() scheduler batches",
    ),
    Row(
        "serve.max_queue_size",
        None,
        "serve",
        "dynamic_batching max_queue_size",
        why_not="NVIDIA's llmapi model runs without Triton batching (max_batch_size 0): the LLM() scheduler batches",
    ),
    Row(
        "serve.postprocessing_dynamic_batching",
        None,
        "serve",
        "the postprocessing model's dynamic_batching",
        why_not="NVIDIA's llmapi layout has no postprocessing model: the LLM() model returns text",
    ),
    Row(
        "serve.exclude_input_in_output",
        None,
        "serve",
        "exclude_input_in_output",
        why_not="the llmapi model returns only generated text (a request may ask otherwise: sampling_param_exclude_input_from_output)",
    ),
)
TRITON_ONLY = {"serve.decoupled": "triton_config.decoupled (model.yaml only: trtllm-serve streams over SSE)"}

# decoding types whose speculative_model_dir is the checkpoint at <engine>/draft; build.speculative.mode's
# speculative_config, or why the PyTorch path refuses it, is the mode's (pipeline/speculative/<mode>.py llmapi_config)
_DRAFT_DIR_TYPES = (DRAFT_TARGET, EAGLE3)
DRAFT_MODEL_DIR = "draft"  # the draft's (or EAGLE-3 heads') checkpoint inside the build's engine directory
# build.speculative.draft fields the PyTorch path has no option for: the draft runs inside the target's LLM()
DRAFT_LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
# serve.guided_decoding -> guided_decoding_backend (None: the option is left out).
GUIDED_DECODING_BACKENDS: Mapping[str, str | None] = {"xgrammar": "xgrammar", "none": None}


def _get(root: Any, dotted: str) -> Any:
    value = root
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _default_of(root: BaseModel, dotted: str) -> Any:
    *parents, name = dotted.split(".")
    owner = _get(root, ".".join(parents)) if parents else root
    info = type(owner).model_fields[name]
    return info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, name = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return nested


def _flat_rows(root: Any, stage: str, *, prefix: str = "") -> dict[str, tuple[str, Any]]:
    """option → (spec field, value) of the rows of `stage` that have an option; `root` is the Spec (or the section
    `prefix` names, e.g. the ServeSpec with prefix "serve.")."""
    options = {}
    for row in ROWS:
        if row.stage != stage or row.option is None or not row.spec_field.startswith(prefix):
            continue
        value = row.value(_get(root, row.spec_field[len(prefix) :]))
        if value is not None:  # None: the option is left out (NVIDIA's default applies)
            options[row.option] = (row.spec_field, value)
    return options


def build_options(spec: Spec, model: ModelInfo) -> dict[str, Any]:
    """The LLM() options of the build rows, the recorded decisions and the speculative config, nested."""
    flat = {option: value for option, (_, value) in _flat_rows(spec, "build").items()}
    flat["max_seq_len"] = spec.build.max_seq_len or model.default_max_seq_len()
    windows = window_vector(model.layer_windows, flat["max_seq_len"])
    if windows:  # the PyTorch backend keeps each sliding layer's window only when told (Gemma README's trtllm-serve examples)
        flat["kv_cache_config.max_attention_window"] = windows
    flat.update(FIXED_OPTIONS)
    options = _nest(flat)
    speculative = spec.build.speculative
    if speculative is not None:
        config = _speculative_config(speculative)
        if not isinstance(config, dict):
            raise SpecError(_speculative_refusal(speculative))
        options["speculative_config"] = config
    return {**options, **lora_options(spec)}


def with_draft_model_dir(options: Mapping[str, Any], model_path: str) -> dict[str, Any]:
    """The options with a draft-target or EAGLE-3 speculative_config pointed at the draft's checkpoint under the served
    model."""
    speculative = options.get("speculative_config")
    if not isinstance(speculative, Mapping) or speculative.get("decoding_type") not in _DRAFT_DIR_TYPES:
        return dict(options)
    return {**options, "speculative_config": {**speculative, "speculative_model_dir": f"{model_path}/{DRAFT_MODEL_DIR}"}}


def serve_options(serve: Any) -> dict[str, Any]:
    """The LLM() options of the serve rows, nested (`serve`: the spec's ServeSpec)."""
    return _nest({option: value for option, (_, value) in _flat_rows(serve, "serve", prefix="serve.").items()})


def merged_options(build: Mapping[str, Any], serve: Mapping[str, Any]) -> dict[str, Any]:
    """build ∪ serve, nested configs (kv_cache_config) merged key by key."""
    merged = {key: dict(value) if isinstance(value, Mapping) else value for key, value in build.items()}
    for key, value in serve.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


def _speculative_config(speculative: SpeculativeSpec) -> dict[str, Any] | str | None:
    if speculative.mode not in registered_modes():
        return None
    return rules_for(speculative.mode).llmapi_config(speculative)


def _speculative_refusal(speculative: SpeculativeSpec) -> str:
    config = _speculative_config(speculative)
    why = config if isinstance(config, str) else "the llmapi target does not render it in this version"
    return f"build.speculative.mode {speculative.mode.value} is refused on {TARGET}: {why}"


def option_issues(spec: Spec, model: ModelInfo) -> list[Issue]:
    """Every spec fact the PyTorch path of build.trtllm_version cannot take, naming the field and the target."""
    try:
        version = get_llmapi_version(spec.build.trtllm_version)
    except SpecError as exc:
        return [(("build", "trtllm_version"), exc.message)]
    issues: list[Issue] = []
    for row in ROWS:
        if row.option is None and _get(spec, row.spec_field) != _default_of(spec, row.spec_field):
            issues.append((tuple(row.spec_field.split(".")), f"{row.spec_field} has no LLM() option on {TARGET}: {row.why_not}; leave it at its default"))
    speculative = spec.build.speculative
    if speculative is not None and not isinstance(_speculative_config(speculative), dict):
        issues.append((("build", "speculative", "mode"), _speculative_refusal(speculative)))
    draft = speculative.draft if speculative is not None else None
    for name in DRAFT_LIMITS if draft is not None else ():
        if getattr(draft, name) is not None:
            issues.append(
                (
                    ("build", "speculative", "draft", name),
                    (
                        f"build.speculative.draft.{name} has no LLM() option on {TARGET}: DraftTargetDecodingConfig loads the draft "
                        "from speculative_model_dir and runs it inside the target's LLM(), with the target's limits; leave it unset"
                    ),
                )
            )
    if issues:
        return issues
    fields = {**_flat_rows(spec, "build"), **_flat_rows(spec, "serve"), **lora_option_fields(spec)}
    fields["max_seq_len"] = ("build.max_seq_len", spec.build.max_seq_len or model.default_max_seq_len())
    fields.update({option: ("(recorded decision)", value) for option, value in FIXED_OPTIONS.items()})
    return [(tuple(field.split(".")) if field[0] != "(" else ("build", "target"), problem) for field, problem in version_problems(fields, version)]


def version_problems(fields: Mapping[str, tuple[str, Any]], version: LlmapiVersion) -> list[tuple[str, str]]:
    """(spec field, problem) for each option `version` lacks or whose value its TorchLlmArgs field rejects."""
    problems = []
    for option, (field, value) in fields.items():
        kind = version.options.get(option)
        if kind is None:
            problems.append((field, f"{field} sets LLM() option {option}, which TensorRT-LLM {version.version} does not have ({TARGET})"))
            continue
        why = check_value(option, value, kind)
        if why is not None:
            problems.append((field, f"{field} → {why} (TensorRT-LLM {version.version}, {TARGET})"))
    return problems


def flatten(options: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested LLM() options → dotted paths (the inverse of _nest, for checks)."""
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping) and key != "speculative_config":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

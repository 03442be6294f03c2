"""Supported TensorRT-LLM versions for the engine target, and the trtllm-build command line of each.

One row per version: the Triton image that ships it, its TensorRT and CUDA, and the trtllm-build
flag set with its defaults. Flags and defaults: NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py and
tensorrt_llm/plugin/plugin.py of each line (plugin defaults of 0.19-1.2: tokens_per_block 32, paged and FP8
context FMHA on; the auto-parallel flags were removed in 1.2 by NVIDIA/TensorRT-LLM PR #8329). Images, TensorRT
and CUDA: NVIDIA's Triton release compatibility matrix for the `-trtllm-python-py3` containers
(docs.nvidia.com/deeplearning/triton-inference-server, "Release Compatibility Matrix"). 1.2.x is the last release
line that builds engines: trtllm-build and the engine backend were removed from TensorRT-LLM's main branch after
it (PRs #15763, #15907), and triton-inference-server/tensorrtllm_backend pins 1.2.1 (PR #853). No Triton release
carrying 1.2.1 is in the matrix, so its tag is inferred and marked so (`triton_tag_inferred`).

`validate_argv` checks a rendered argv against a recorded argument schema (a JSON document, see
tests/data/trtllm_build_1_2_1_args.json): unknown, removed or deprecated flags, bad choices and
values of the wrong type are errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pipeline.errors import PipelineError, SpecError

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"
DEFAULT_VERSION = "1.2.1"
LAST_ENGINE_LINE = (1, 2)  # trtllm-build was removed upstream after the 1.2.x line

# -- trtllm-build flags (commands/build.py and PluginConfig), as argv strings -----------------------
_INPUT = {
    "--checkpoint_dir": None,
    "--model_config": None,
    "--build_config": None,
    "--model_cls_file": None,
    "--model_cls_name": None,
    "--output_dir": "engine_outputs",
    "--workers": "1",
    "--log_level": "info",
}
_SIZES = {
    "--max_batch_size": "2048",
    "--max_input_len": "1024",
    "--max_seq_len": None,
    "--max_beam_width": "1",
    "--max_num_tokens": "8192",
    "--opt_num_tokens": None,
    "--max_encoder_input_len": "1024",
    "--max_prompt_embedding_table_size": "0",
    "--max_draft_len": "0",
}
_KV = {"--kv_cache_type": None, "--paged_kv_cache": None, "--tokens_per_block": "32"}  # kv_cache_type unset -> paged
_BUILD = {
    "--input_timing_cache": None,
    "--output_timing_cache": "model.cache",
    "--profiling_verbosity": "layer_names_only",
    "--strip_plan": None,
    "--weight_sparsity": None,
    "--weight_streaming": None,
    "--fast_build": None,
    "--enable_debug_output": None,
    "--visualize_network": None,
    "--dry_run": None,
    "--monitor_memory": None,
}
_LOGITS_LORA_SPEC = {
    "--logits_dtype": None,
    "--gather_context_logits": None,
    "--gather_generation_logits": None,
    "--gather_all_token_logits": None,
    "--lora_dir": None,
    "--lora_ckpt_source": "hf",
    "--lora_target_modules": None,
    "--max_lora_rank": "64",
    "--speculative_decoding_mode": None,
}
_PLUGINS = {
    "--bert_attention_plugin": "auto",
    "--gpt_attention_plugin": "auto",
    "--gemm_plugin": "disable",
    "--gemm_swiglu_plugin": "disable",
    "--fp8_rowwise_gemm_plugin": "disable",
    "--low_latency_gemm_plugin": "disable",
    "--low_latency_gemm_swiglu_plugin": "disable",
    "--gemm_allreduce_plugin": "disable",
    "--lora_plugin": "disable",
    "--dora_plugin": "disable",
    "--moe_plugin": "auto",
    "--mamba_conv1d_plugin": "auto",
    "--nccl_plugin": "auto",
    "--context_fmha": "enable",
    "--bert_context_fmha_fp32_acc": "disable",
    "--remove_input_padding": "enable",
    "--reduce_fusion": "disable",
    "--user_buffer": "disable",
    "--norm_quant_fusion": "disable",
    "--use_paged_context_fmha": "enable",
    "--use_fp8_context_fmha": "enable",
    "--fuse_fp4_quant": "disable",
    "--multiple_profiles": "disable",
    "--paged_state": "enable",
    "--streamingllm": "disable",
    "--use_fused_mlp": "enable",
    "--pp_reduce_scatter": "disable",
}
_AUTO_PARALLEL = {"--auto_parallel": "1", "--gpus_per_node": "8", "--cluster_key": None}  # ≤ 1.1 only (removed in 1.2, PR #8329)

_FLAGS_1_2 = {**_INPUT, **_SIZES, **_KV, **_BUILD, **_LOGITS_LORA_SPEC, **_PLUGINS}
_FLAGS_1_0_1_1 = {**_FLAGS_1_2, **_AUTO_PARALLEL}


@dataclass(frozen=True)
class TrtllmVersion:
    """One supported TensorRT-LLM release: its serving/build container and its trtllm-build CLI."""

    version: str
    triton_tag: str  # nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3
    triton_tag_inferred: bool  # True: not in NVIDIA's compatibility matrix, verify before pinning
    tensorrt: str
    cuda: str
    source: str  # where the row's facts come from
    flag_defaults: Mapping[str, str | None] = field(repr=False)  # every accepted flag -> default (None: unset or a switch)

    @property
    def image(self) -> str:
        return TRITON_IMAGE.format(tag=self.triton_tag)

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.flag_defaults)

    def accepts(self, flag: str) -> bool:
        return flag in self.flag_defaults

    def default(self, flag: str) -> str | None:
        if flag not in self.flag_defaults:
            raise KeyError(f"trtllm-build {self.version} has no flag {flag}")
        return self.flag_defaults[flag]


def _row(version: str, tag: str, inferred: bool, tensorrt: str, cuda: str, source: str, flags: dict) -> TrtllmVersion:
    return TrtllmVersion(version, tag, inferred, tensorrt, cuda, source, MappingProxyType(dict(flags)))


SUPPORTED_VERSIONS: Mapping[str, TrtllmVersion] = MappingProxyType(
    {
        # Triton tag inferred: the compatibility matrix has no 26.0x row yet; tensorrtllm_backend's Dockerfile
        # (Mar–Jul 2026) builds 1.2.1 on tritonserver:25.12-py3-min + TensorRT 10.14.1.48 with a CUDA 13.0
        # tarball (Triton 26.02 itself ships CUDA 13.1.1). Check `pip show tensorrt_llm` in the image.
        "1.2.1": _row("1.2.1", "26.02", True, "10.14.1.48", "13.0", "tensorrtllm_backend Dockerfile.triton.trt_llm_backend (tag inferred)", _FLAGS_1_2),
        "1.1.0": _row("1.1.0", "25.12", False, "10.13.3.9", "13.0.2.006", "NVIDIA's Triton release compatibility matrix", _FLAGS_1_0_1_1),
        "1.0.0": _row("1.0.0", "25.09", False, "10.11.0.33", "12.9.1.010", "NVIDIA's Triton release compatibility matrix (25.10 ships it too)", _FLAGS_1_0_1_1),
    }
)


def get_version(version: str) -> TrtllmVersion:
    """The supported release `version`, or a SpecError naming it and listing the supported ones."""
    row = SUPPORTED_VERSIONS.get(str(version).strip())
    if row is not None:
        return row
    supported = ", ".join(SUPPORTED_VERSIONS)
    why = ""
    if _newer_than_engine_line(str(version)):
        why = " (trtllm-build and engines were removed from TensorRT-LLM after the 1.2.x line)"
    raise SpecError(
        f"TensorRT-LLM version {version!r} is not supported by the engine target{why}; supported: {supported}",
        hint=f"use one of {supported} (default {DEFAULT_VERSION})",
    )


def version_for_image(reference: str) -> TrtllmVersion | None:
    """The profile whose Triton TRT-LLM image `reference` is (`…/tritonserver:<tag>-trtllm-python-py3`,
    with or without a digest), or None for any other image or an unrecorded tag."""
    name = reference.split("@", 1)[0]
    repository, _, tag = name.rpartition(":")
    suffix = "-trtllm-python-py3"
    if not repository.endswith("tritonserver") or not tag.endswith(suffix):
        return None
    triton_tag = tag[: -len(suffix)]
    return next((row for row in SUPPORTED_VERSIONS.values() if row.triton_tag == triton_tag), None)


def _newer_than_engine_line(version: str) -> bool:
    parts = version.split(".")[:2]
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return False
    return (int(parts[0]), int(parts[1])) > LAST_ENGINE_LINE


# -- argv validation against a recorded argument schema ----------------------------------------------
class ArgvSchemaError(PipelineError):
    """A rendered trtllm-build command does not match the recorded argument schema."""

    default_hint = "this is a bug in the command renderer: the flag set must follow trtllm-build's own (tensorrt_llm/commands/build.py)"


def load_argument_schema(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def validate_argv(argv: Sequence[str], schema: Mapping[str, Any]) -> None:
    """Raise ArgvSchemaError listing every unknown, removed, deprecated, duplicated or ill-typed flag."""
    problems: list[str] = []
    tool = schema.get("tool", "trtllm-build")
    if not argv or argv[0] != tool:
        problems.append(f"argv must start with {tool!r}, got {argv[0] if argv else 'nothing'!r}")
    flags: Mapping[str, Mapping[str, Any]] = schema["flags"]
    aliases: Mapping[str, str] = schema.get("aliases", {})
    removed: Mapping[str, str] = schema.get("removed", {})
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            problems.append(f"unexpected positional value {token!r}")
            continue
        name = aliases.get(token, token)
        if name in removed:
            problems.append(f"{token}: not a trtllm-build {schema.get('version', '')} flag ({removed[name]})")
            continue
        meta = flags.get(name)
        if meta is None:
            problems.append(f"{token}: unknown trtllm-build flag")
            continue
        if name in seen:
            problems.append(f"{token}: given more than once")
        seen.add(name)
        if meta.get("deprecated"):
            problems.append(f"{token}: deprecated ({meta['deprecated']})")
        values: list[str] = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        problems += _check_values(token, meta, values)
    for group in schema.get("required_one_of", []):
        if not seen.intersection(group):
            problems.append(f"one of {', '.join(group)} is required")
    if problems:
        raise ArgvSchemaError(f"{tool} command does not match the recorded {schema.get('version', '')} argument schema:\n  " + "\n  ".join(problems))


def _check_values(flag: str, meta: Mapping[str, Any], values: list[str]) -> list[str]:
    kind = meta["type"]
    if kind == "switch":
        return [f"{flag}: takes no value, got {' '.join(values)!r}"] if values else []
    many = meta.get("nargs") == "+"
    if not values or (len(values) > 1 and not many):
        wanted = "one or more values" if many else "exactly one value"
        return [f"{flag}: takes {wanted}, got {len(values)}"]
    problems = []
    for value in values:
        if kind == "int":
            if not _is_int(value):
                problems.append(f"{flag}: expects an integer, got {value!r}")
            elif "min" in meta and int(value) < int(meta["min"]):
                problems.append(f"{flag}: must be >= {meta['min']}, got {value}")
        elif kind == "choice":
            choices = list(meta["choices"])
            probe = value.lower() if meta.get("case_insensitive") else value
            if probe not in choices:
                problems.append(f"{flag}: {value!r} is not one of {', '.join(choices)}")
        elif kind in ("path", "str"):
            if not value:
                problems.append(f"{flag}: expects a non-empty {kind}")
        else:
            problems.append(f"{flag}: the schema has an unknown type {kind!r}")
    return problems


def _is_int(value: str) -> bool:
    text = value[1:] if value.startswith("-") else value
    return text.isdigit()

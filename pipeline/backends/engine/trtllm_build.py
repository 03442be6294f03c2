"""The engine target's build: Spec + ModelInfo -> `build_config.json` and the exact `trtllm-build` argv.

Every build-time constraint and silent auto-override of trtllm-build (`trtllm_rules`, which names
TensorRT-LLM's sources) becomes an explicit decision here: either a SpecError naming the
fields and values, or a `Decision` that says what was changed (or warned about) and why. The
rendered files then carry the values TensorRT-LLM will actually use, so nothing changes silently
between the YAML and the engine.

trtllm-build is given `--build_config` (a full BuildConfig with a `plugin_config` section, so
`kv_cache_type` is honoured: build.py reads it from that file only then) *and* the same values as CLI flags: with `--build_config` the
CLI size flags are ignored and the plugin flags form the base that `plugin_config` overrides, so
the command reads the same either way.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backends.engine.build_request import BuildRequest
from pipeline.backends.engine.build_rules import Decision, resolve
from pipeline.backends.engine.spec_request import request_from_spec
from pipeline.backends.engine_facts import SPECULATIVE_DECODING_MODE
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.errors import PipelineError, SpecError
from pipeline.quant_formats import kv_cache_format, weight_format
from pipeline.trtllm_versions import TrtllmVersion

__all__ = [
    "BUILD_CONFIG_FILE",
    "TIMING_CACHE_FILE",
    "SCRIPT_FILE",
    "LOG_LEVELS",
    "SPECULATIVE_DECODING_MODE",
    "BuildRequest",
    "Decision",
    "TrtllmBuild",
    "plan_trtllm_build",
    "plan_from_request",
    "render_build_config",
    "render_argv",
    "render_script",
]

BUILD_CONFIG_FILE = "build_config.json"
TIMING_CACHE_FILE = "model.cache"
SCRIPT_FILE = "trtllm-build.sh"
LOG_LEVELS = ("internal_error", "error", "warning", "info", "verbose", "debug", "trace")

ENGINE_LORA_DIR = "lora"  # trtllm-build copies adapter i into <engine>/lora/<i>/ and records that relative path


@dataclass(frozen=True)
class TrtllmBuild:
    """Everything a build runner needs: the command, the BuildConfig JSON, and why values differ from the spec."""

    name: str
    version: TrtllmVersion
    settings: BuildRequest  # the applied values (after every Decision)
    decisions: tuple[Decision, ...]
    checkpoint_dir: Path
    output_dir: Path
    hf_dir: Path  # the Hugging Face checkpoint (a dry run derives pretrained_config from it when there are no weights)
    build_config: dict[str, Any]
    argv: tuple[str, ...]
    workers: int

    @property
    def build_config_path(self) -> Path:
        return self.output_dir / BUILD_CONFIG_FILE

    @property
    def timing_cache_path(self) -> Path:
        return self.output_dir / TIMING_CACHE_FILE

    @property
    def engine_build_config(self) -> dict[str, Any]:
        """`build_config` as trtllm-build records it in the engine's config.json: speculative decoding adds max_draft_len
        to max_seq_len, EAGLE also num_eagle_layers (builder.build), and each LoRA adapter is copied to lora/<i> (Engine.save)."""
        recorded = copy.deepcopy(self.build_config)
        s = self.settings
        if s.speculative_decoding_mode is not None:
            recorded["max_seq_len"] += s.max_draft_len + s.num_eagle_layers
        recorded["lora_config"]["lora_dir"] = [f"{ENGINE_LORA_DIR}/{i}" for i in range(len(s.lora_dirs))]
        return recorded

    @property
    def quantization(self) -> dict[str, Any]:
        """The checkpoint's `quantization` section this build expects (TensorRT-LLM names)."""
        s = self.settings
        weights = weight_format(s.quant_algo)
        section: dict[str, Any] = {
            "quant_algo": weights.trtllm_quant_algo,
            "kv_cache_quant_algo": kv_cache_format(s.kv_cache_quant).trtllm_kv_quant_algo,
        }
        if weights.group_wise:
            section.update(group_size=s.group_size, has_zero_point=False, pre_quant_scale=True)
        if weights.quantized:
            section["exclude_modules"] = ["lm_head"]
        return section

    @property
    def mapping(self) -> dict[str, int]:
        s = self.settings
        return {"world_size": s.world_size, "tp_size": s.tp_size, "pp_size": s.pp_size}


def plan_trtllm_build(
    spec: Spec,
    model: ModelInfo,
    checkpoint_dir: Path,
    output_dir: Path,
    version: TrtllmVersion,
    sm: int | None = None,
    *,
    workers: int = 1,
    log_level: str = "info",
) -> TrtllmBuild:
    """Resolve the spec against trtllm-build's rules and render its inputs. Writes nothing; reads nothing but a LoRA
    adapter's adapter_config.json when build.lora leaves target_modules to it.

    `sm` is the target GPU's compute capability as an integer (89 for 8.9, 90 for 9.0, 100 for 10.0), or
    None when no GPU is declared (then GPU-specific checks are reported as warnings, not applied).
    """
    return plan_from_request(request_from_spec(spec, model), model.path, checkpoint_dir, output_dir, version, sm, workers=workers, log_level=log_level)


def plan_from_request(
    request: BuildRequest,
    hf_dir: Path,
    checkpoint_dir: Path,
    output_dir: Path,
    version: TrtllmVersion,
    sm: int | None = None,
    *,
    workers: int = 1,
    log_level: str = "info",
) -> TrtllmBuild:
    for what, path in (("checkpoint_dir", checkpoint_dir), ("output_dir", output_dir)):
        if not Path(path).is_absolute():
            raise SpecError(f"trtllm-build {what} must be an absolute path, got {str(path)!r}")
    if log_level not in LOG_LEVELS:
        raise SpecError(f"trtllm-build log level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if workers < 1:
        raise SpecError(f"build workers must be >= 1, got {workers}")
    settings, decisions = resolve(request, sm)
    if workers > settings.world_size:
        decisions = decisions + (
            Decision(
                "build.workers",
                workers,
                settings.world_size,
                f"trtllm-build builds one engine per rank (world size {settings.world_size}); more workers than ranks only idle",
            ),
        )
        workers = settings.world_size
    checkpoint_dir, output_dir = Path(checkpoint_dir), Path(output_dir)
    timing_cache = output_dir / TIMING_CACHE_FILE
    build_config = render_build_config(settings, timing_cache=timing_cache)
    argv = render_argv(
        settings,
        version,
        checkpoint_dir=checkpoint_dir,
        output_dir=output_dir,
        build_config_path=output_dir / BUILD_CONFIG_FILE,
        timing_cache=timing_cache,
        workers=workers,
        log_level=log_level,
    )
    return TrtllmBuild(
        name=request.name,
        version=version,
        settings=settings,
        decisions=decisions,
        checkpoint_dir=checkpoint_dir,
        output_dir=output_dir,
        hf_dir=Path(hf_dir),
        build_config=build_config,
        argv=tuple(argv),
        workers=workers,
    )


def _plugin_dtype(value: str) -> str | None:
    return None if value == "disable" else value


def render_build_config(s: BuildRequest, *, timing_cache: Path) -> dict[str, Any]:
    """BuildConfig as TensorRT-LLM 1.2 reads it with --build_config (and records it in the engine's config.json).

    Only the fields `Engine.save` (tensorrt_llm/builder.py) writes into an engine's build_config (the same keys as the cpu target's
    `cpu_build_config`, plus the timing-cache paths, force_num_profiles and profiling_verbosity).
    """
    if s.max_seq_len is None:
        raise PipelineError("render_build_config needs resolved settings (max_seq_len is None)")
    config: dict[str, Any] = {
        "max_input_len": s.max_input_len,
        "max_seq_len": s.max_seq_len,
        "max_batch_size": s.max_batch_size,
        "max_beam_width": s.max_beam_width,
        "max_num_tokens": s.max_num_tokens,
        "opt_num_tokens": s.opt_num_tokens,
        "max_prompt_embedding_table_size": 0,
        "kv_cache_type": s.kv_cache_type.upper(),
        "gather_context_logits": s.gather_context_logits,
        "gather_generation_logits": False,  # deprecated in 1.x: generation logits are a runtime output
        "strongly_typed": True,
        "force_num_profiles": None,
        "profiling_verbosity": "layer_names_only",
        "max_draft_len": s.max_draft_len,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE[s.speculative_decoding_mode],  # 1 = NONE
        "use_refit": False,
        "input_timing_cache": None,
        "output_timing_cache": str(timing_cache),
        "lora_config": {
            "lora_dir": list(s.lora_dirs),
            "lora_ckpt_source": s.lora_ckpt_source,
            "max_lora_rank": s.max_lora_rank,
            "lora_target_modules": list(s.lora_target_modules),
        },
        "weight_sparsity": False,
        "weight_streaming": False,
        "use_strip_plan": False,
        "max_encoder_input_len": 1024,
        "monitor_memory": False,
        "use_mrope": False,
        "plugin_config": {
            "dtype": s.dtype,
            "gpt_attention_plugin": _plugin_dtype(s.gpt_attention_plugin),
            "gemm_plugin": _plugin_dtype(s.gemm_plugin),
            "context_fmha": s.context_fmha,
            "use_paged_context_fmha": s.use_paged_context_fmha,
            "use_fp8_context_fmha": s.use_fp8_context_fmha,
            "use_fused_mlp": s.use_fused_mlp,
            "remove_input_padding": s.remove_input_padding,
            "reduce_fusion": s.reduce_fusion,
            "multiple_profiles": s.multiple_profiles,
            "paged_kv_cache": s.kv_cache_type == "paged",
            "tokens_per_block": s.tokens_per_block,
        },
    }
    if s.lora_plugin != "disable":  # absent: PluginConfig's default (disabled), as in every config without LoRA
        config["plugin_config"]["lora_plugin"] = s.lora_plugin
    return config


def _switch(value: bool) -> str:
    return "enable" if value else "disable"


def render_argv(
    s: BuildRequest,
    version: TrtllmVersion,
    *,
    checkpoint_dir: Path,
    output_dir: Path,
    build_config_path: Path,
    timing_cache: Path,
    workers: int,
    log_level: str,
) -> list[str]:
    pairs: list[tuple[str, str | tuple[str, ...]]] = [
        ("--checkpoint_dir", str(checkpoint_dir)),
        ("--output_dir", str(output_dir)),
        ("--build_config", str(build_config_path)),
        ("--max_batch_size", str(s.max_batch_size)),
        ("--max_input_len", str(s.max_input_len)),
        ("--max_seq_len", str(s.max_seq_len)),
        ("--max_num_tokens", str(s.max_num_tokens)),
        ("--max_beam_width", str(s.max_beam_width)),
    ]
    if s.opt_num_tokens is not None:
        pairs.append(("--opt_num_tokens", str(s.opt_num_tokens)))
    if s.speculative_decoding_mode is not None:
        pairs += [("--speculative_decoding_mode", s.speculative_decoding_mode), ("--max_draft_len", str(s.max_draft_len))]
    pairs += [
        ("--kv_cache_type", s.kv_cache_type),
        ("--tokens_per_block", str(s.tokens_per_block)),
        ("--gpt_attention_plugin", s.gpt_attention_plugin),
        ("--gemm_plugin", s.gemm_plugin),
        ("--context_fmha", _switch(s.context_fmha)),
        ("--use_paged_context_fmha", _switch(s.use_paged_context_fmha)),
        ("--use_fp8_context_fmha", _switch(s.use_fp8_context_fmha)),
        ("--use_fused_mlp", _switch(s.use_fused_mlp)),
        ("--reduce_fusion", _switch(s.reduce_fusion)),
        ("--multiple_profiles", _switch(s.multiple_profiles)),
        ("--remove_input_padding", _switch(s.remove_input_padding)),
    ]
    if s.lora_plugin != "disable":
        # With --build_config these still count: trtllm-build builds lora_config from the --lora_* flags whenever the
        # LoRA plugin is on (commands/build.py build_model), replacing the file's lora_config.
        pairs.append(("--lora_plugin", s.lora_plugin))
        if s.lora_dirs:
            pairs.append(("--lora_dir", tuple(s.lora_dirs)))
        pairs += [
            ("--lora_ckpt_source", s.lora_ckpt_source),
            ("--lora_target_modules", tuple(s.lora_target_modules)),
            ("--max_lora_rank", str(s.max_lora_rank)),
        ]
    pairs += [
        ("--output_timing_cache", str(timing_cache)),
        ("--workers", str(workers)),
        ("--log_level", log_level),
    ]
    unknown = [flag for flag, _ in pairs if not version.accepts(flag)]
    if unknown:
        raise PipelineError(f"trtllm-build {version.version} has no flag(s) {', '.join(unknown)}")
    argv = ["trtllm-build"]
    for flag, value in pairs:
        argv += [flag, *value] if isinstance(value, tuple) else [flag, value]
    return argv


def render_script(build: TrtllmBuild) -> str:
    """`trtllm-build.sh`: the command, one flag per line, preceded by the version pin and every decision."""
    v = build.version
    tag_note = " (tag inferred, verify the TensorRT-LLM version inside)" if v.triton_tag_inferred else ""
    lines = [
        "#!/usr/bin/env bash",
        f"# trtllm-build for {build.name}: TensorRT-LLM {v.version}, TensorRT {v.tensorrt}, CUDA {v.cuda}",
        f"# image: {v.image}{tag_note}",
        "# rendered by trtllm-pipeline. --build_config is authoritative: with it trtllm-build",
        "# ignores the size flags below, which repeat its values; plugin flags are overridden by its plugin_config.",
    ]
    if build.decisions:
        lines.append("# decisions (what differs from the build config, and why):")
        lines += [f"#   {d}" for d in build.decisions]
    lines.append("set -euo pipefail")
    argv = list(build.argv)
    body = [shlex.quote(argv[0])]
    i = 1
    while i < len(argv):  # one flag per line, with all its values (--lora_dir and --lora_target_modules take several)
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        body.append(" ".join([argv[i], *(shlex.quote(value) for value in argv[i + 1 : j])]))
        i = j
    lines.append(" \\\n  ".join(body))
    return "\n".join(lines) + "\n"

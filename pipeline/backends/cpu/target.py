"""The cpu target: refengine behind Triton's Python backend, on this machine.

Its build writes an engine directory laid out like a TensorRT-LLM 1.2 engine, for refengine:
`config.json` carries the same top-level keys as `trtllm-build` writes (`version`, `pretrained_config`,
`build_config` with `plugin_config`), so the package stage reads both targets alike. Instead of
`rank0.engine` (a TensorRT plan) the directory holds the checkpoint's `rank0.safetensors`, which
refengine executes with TensorRT-LLM's numerics.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.base import BuildJob, BuiltEngine, ComposeFacts, RuntimeAbilities, TritonLlmModel
from pipeline.backends.cpu.speculative import add_speculation
from pipeline.backends.engine_facts import CPU_ENGINE_VERSION_PREFIX, SPECULATIVE_DECODING_MODE, EngineFacts
from pipeline.backends.llm_parameters import cpu_parameters
from pipeline.config.effective_quantization import Quantization, effective_quantize
from pipeline.config.gpus import ENGINE_MEMORY_MODEL, RUNTIME_RESERVE_GB
from pipeline.config.lora_adapters import spec_target_modules
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import BuildSpec, QuantizeSpec, ServeSpec, Spec, SpeculativeSpec, Target
from pipeline.config.targets import traits_of
from pipeline.errors import StageError
from pipeline.quant_formats import WEIGHT_FORMATS, kv_cache_format, paged_context_fmha_loss, weight_format
from pipeline.tools import tool_versions


def resolve_max_seq_len(build: BuildSpec, deduced: int) -> int:
    return build.max_seq_len if build.max_seq_len is not None else deduced


def cpu_build_config(build: BuildSpec, *, max_seq_len: int, dtype: str, quantize: QuantizeSpec | Quantization | None = None) -> dict[str, Any]:
    """BuildConfig fields as TensorRT-LLM 1.2 records them in an engine's config.json (for the checkpoint's
    `quantize` formats; None: unquantized). A speculative engine records its max_draft_len and mode flag as
    trtllm-build does, max_seq_len included (trtllm-build adds max_draft_len to it)."""
    plugins = build.plugins
    keeps_paged_context_fmha = quantize is None or paged_context_fmha_loss(weight_format(quantize.algo), kv_cache_format(quantize.kv_cache)) is None
    max_num_tokens = min(build.max_num_tokens, build.max_batch_size * max_seq_len)
    speculative = build.speculative
    draft_len = speculative.draft_len if speculative is not None else 0
    if speculative is not None:  # trtllm-build's builder: room for the draft tokens of every sequence (builder.py)
        max_seq_len += draft_len
        max_num_tokens = max(max_num_tokens, build.max_batch_size * (draft_len + 1))
    return {
        "max_batch_size": build.max_batch_size,
        "max_input_len": build.max_input_len,
        "max_seq_len": max_seq_len,
        "max_beam_width": build.max_beam_width,
        "max_num_tokens": max_num_tokens,
        "opt_num_tokens": build.opt_num_tokens,
        "max_prompt_embedding_table_size": 0,
        "kv_cache_type": build.kv_cache_type.value.upper(),
        "gather_context_logits": False,
        "gather_generation_logits": False,
        "strongly_typed": True,
        "max_draft_len": draft_len,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE[speculative.engine_mode if speculative is not None else None],
        "use_refit": False,
        "weight_sparsity": False,
        "weight_streaming": False,
        "use_strip_plan": False,
        "max_encoder_input_len": 1024,
        "monitor_memory": False,
        "use_mrope": False,
        "lora_config": _lora_config(build),
        "plugin_config": {
            "dtype": dtype,
            "gpt_attention_plugin": plugins.gpt_attention_plugin.value if plugins.gpt_attention_plugin.value != "disable" else None,
            "gemm_plugin": None if plugins.gemm_plugin.value == "disable" else plugins.gemm_plugin.value,
            "context_fmha": plugins.context_fmha,
            "use_paged_context_fmha": plugins.use_paged_context_fmha and plugins.context_fmha and keeps_paged_context_fmha,
            "use_fp8_context_fmha": False,  # no FP8 attention kernels on the CPU
            "use_fused_mlp": plugins.use_fused_mlp,
            "remove_input_padding": plugins.remove_input_padding,
            "reduce_fusion": False,
            "multiple_profiles": plugins.multiple_profiles,
            "paged_kv_cache": build.kv_cache_type.value == "paged",
            "tokens_per_block": build.tokens_per_block,
            **({"lora_plugin": dtype} if build.lora is not None else {}),  # trtllm-build: the LoRA plugin in the model's dtype
        },
    }


def _lora_on_folded_scales(spec: Spec, quantize: Quantization) -> list[Issue]:
    weights = weight_format(quantize.algo)
    if spec.build.lora is None or not weights.folds_input_scale:
        return []
    fits = [name for name, f in WEIGHT_FORMATS.items() if not f.folds_input_scale and f.runs_on(Target.cpu)]
    return [
        (
            ("build", "lora"),
            f"build.lora cannot be combined with quantize.algo {weights.name} on build.target cpu: its "
            "checkpoint folds an activation scale into the norm before each Linear, so the reference engine's LoRA update would "
            f"read the scaled input, not the model's; use quantize.algo {', '.join(fits)}",
        )
    ]


def _lora_config(build: BuildSpec) -> dict[str, Any]:
    """build_config.lora_config as trtllm-build records it (its defaults without build.lora). The adapters are not
    copied into the engine: a client sends an adapter's weights with its request (lora_weights / lora_config)."""
    lora = build.lora
    if lora is None:
        return {"lora_dir": [], "lora_ckpt_source": "hf", "max_lora_rank": 64, "lora_target_modules": []}
    modules = spec_target_modules(lora)
    return {"lora_dir": [], "lora_ckpt_source": lora.adapter_source.value, "max_lora_rank": lora.max_rank, "lora_target_modules": list(modules)}


def write_cpu_engine(checkpoint_dir: Path, engine_dir: Path, *, build_config: dict[str, Any], version: str) -> None:
    """Write the engine directory; refengine loads the checkpoint on the way, so a bad one fails here."""
    from refengine import ModelLoadError, write_engine_dir

    try:
        write_engine_dir(checkpoint_dir, engine_dir, build_config, f"{CPU_ENGINE_VERSION_PREFIX}{version}")
    except ModelLoadError as exc:
        raise StageError(f"the reference engine cannot load the checkpoint: {exc}") from exc


class CpuBackend:
    target = Target.cpu
    traits = traits_of(Target.cpu)
    serves_here = True
    triton_version = "2.51.0"  # bundled with nvidia-pytriton 0.7.0 (pyproject.toml): `serve` and the cpu image run it
    llm_api = None
    llm_model = TritonLlmModel(
        template="tensorrt_llm.cpu.pbtxt.j2",
        code=(
            "tensorrt_llm_cpu.py",
            (
                "engine_metrics.py",
                "incremental_detokenizer.py",
                "llm_request.py",
                "llm_response.py",
                "lora_parameters.py",
                "medusa_parameters.py",
                "model_contract.py",
                "model_parameters.py",
                "response_channel.py",
                "triton_io.py",
                "word_lists.py",
            ),
        ),
        returns_preceding_ids=True,
        reads_num_draft_tokens=True,  # refengine's speculative decoding, per request
        takes_priority=True,  # refengine's priority scheduling (serve.traffic)
        reads_paths_in_repository=True,  # model_parameters.path resolves a relative path against the repository
        always_context_logits=True,  # refengine computes them for every request that asks
        runtime=RuntimeAbilities(
            name="the reference engine",
            runs_refengine_engines=True,
            other_engine_kind="the cpu tensorrt_llm model runs only engines written by the cpu build (version 'refengine-…')",
            weight_suffix=".safetensors",
            lora=True,  # refengine's multi-LoRA (refengine/lora), TensorRT-LLM's request tensors and cache
            speculative_decoding=True,  # refengine's: draft-target, prompt lookup and Medusa (refengine_speculative)
            beam_search=True,  # refengine's beam search (#15), up to build.max_beam_width
            multiple_ranks=False,
        ),
    )
    compose = ComposeFacts(
        profile="cpu",
        health_start_period="180s",
        image_has_project=True,
        checks_engine_in_container=False,
        reserves_gpus=False,
        locks_memory=False,
    )

    def preflight(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        build = spec.build
        issues: list[Issue] = []
        if build.max_beam_width > build.max_batch_size:  # refengine runs each beam as a batch row
            issues.append(
                (
                    ("build", "max_beam_width"),
                    f"build.max_beam_width {build.max_beam_width} exceeds build.max_batch_size "
                    f"{build.max_batch_size}: the cpu engine runs each beam as a row of the batch",
                )
            )
        ranks = build.tp_size * build.pp_size
        if ranks == 1:
            return issues
        return issues + [
            (
                ("build", "tp_size"),
                f"build.target cpu runs one rank, but build.tp_size ({build.tp_size}) × build.pp_size "
                f"({build.pp_size}) = {ranks}; use --until quantize to export a sharded checkpoint only",
            )
        ]

    def build(self, job: BuildJob) -> dict[str, Any]:
        build = job.spec.build
        max_seq_len = resolve_max_seq_len(build, job.model.default_max_seq_len())
        quantize = effective_quantize(job.spec, job.model.path)
        build_config = cpu_build_config(build, max_seq_len=max_seq_len, dtype=job.spec.model.dtype.value, quantize=quantize)
        write_cpu_engine(job.checkpoint_dir, job.engine_dir, build_config=build_config, version=tool_versions()["trtllm_pipeline"])
        notes = add_speculation(job.engine_dir, build.speculative, job.draft_engine_dir, max_seq_len=build_config["max_seq_len"])
        job.log(
            f"cpu engine: max_batch_size {build_config['max_batch_size']}, max_seq_len {max_seq_len}, "
            f"max_num_tokens {build_config['max_num_tokens']}, tokens_per_block {build.tokens_per_block}"
        )
        return notes

    def llm_parameters(
        self, facts: EngineFacts, serve: ServeSpec, *, engine_dir: str, gpu_device_ids: Sequence[int], speculative: SpeculativeSpec | None
    ) -> dict[str, str]:
        return cpu_parameters(serve, facts, engine_dir=engine_dir, speculative=speculative)

    def server_image(self, spec: Spec) -> tuple[str, str] | None:
        return None

    def check_serving_host(self, spec: Spec, built: BuiltEngine) -> None:
        return None

    def spec_issues(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        quantize = Quantization(spec.quantize.algo, spec.quantize.kv_cache, spec.quantize.group_size)
        return _lora_on_folded_scales(spec, effective_quantize(spec, model.path) if model is not None else quantize)

    def capacity_reserve(self, spec: Spec) -> tuple[float, str]:
        return RUNTIME_RESERVE_GB, ENGINE_MEMORY_MODEL


BACKEND = CpuBackend()

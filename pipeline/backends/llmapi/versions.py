"""TensorRT-LLM release lines the llmapi target (the PyTorch backend) renders for, and what each accepts.

One profile per release: the NGC images that ship it (Triton's `-trtllm-python-py3` image for the `llmapi`
model, NVIDIA's `tensorrt-llm/release` image for `trtllm-serve`) and the `LLM()` options this project renders,
each with the type and choices NVIDIA's `TorchLlmArgs` gives it. The full recorded field list (names, types,
enums, defaults and where each was read) is tests/data/llmapi_1_2_1_llm_args.json; the tests check that every
option here is one of NVIDIA's and every rendered value fits it.

Facts and confidence ([src]: read in the source of that version; [inf]: inferred, not read):
- 1.2.x is the newest stable line (1.3.0rcN and 1.4.0rcN are release candidates on NVIDIA's documentation
  site, not profiled). The options come from `tensorrt_llm/llmapi/llm_args.py` of the 1.2 era (the stored
  version that still has TrtLlmArgs and PARD: KvCacheConfig with tokens_per_block and free_gpu_memory_fraction
  0.9 in [0, 1], max_batch_size 2048, max_num_tokens 8192, guided_decoding_backend xgrammar|llguidance);
  every option is also in the ≈1.1 and the 2026 `main` versions of that file [src]. The v1.2.1 tag itself was
  not read: the profile is inferred from those versions [inf].
- LoRA: TorchLlmArgs' lora_config (LoraConfig, the dataclass of tensorrt_llm/lora_helper.py until 1.3.0rc2x moved it
  to _torch/peft/lora/config.py: lora_dir, lora_ckpt_source hf|nemo, max_lora_rank 64, lora_target_modules,
  trtllm_modules_to_hf_modules, max_loras, max_cpu_loras) and peft_cache_config (PeftCacheConfig: optimal_adapter_size
  8, max_adapter_size 64, device_cache_percent, host_cache_size) are in the ≈0.20 and 2026 `main` llm_args.py and in
  NVIDIA's LoRA guide of the 1.x docs [src]; in 1.2.1 [inf], like the rest.
- Triton tag: the same inferred 26.02 as the engine profile of 1.2.1 (pipeline.trtllm_versions) [inf].
- trtllm-serve image `nvcr.io/nvidia/tensorrt-llm/release:<version>`: the pattern of NVIDIA's trtllm-serve
  benchmark guide (`release:1.0.0`); the 1.2.1 tag follows it [inf].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.errors import SpecError
from pipeline.trtllm_versions import TRITON_IMAGE

SERVE_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:{version}"
DEFAULT_VERSION = "1.2.1"
ARGS_CLASS = "tensorrt_llm.llmapi.llm_args.TorchLlmArgs"


@dataclass(frozen=True)
class OptionType:
    """What NVIDIA's pydantic field accepts: a Python type name, its choices, its bounds."""

    kind: str  # "str" | "int" | "float" | "bool" | "path" | "list[int]" | "list[str]" | "list[path]"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None


_INT1 = OptionType("int", minimum=1)
_BOOL = OptionType("bool")

# Dotted LLM() option paths (nested configs joined by '.') this project renders.
_OPTIONS_1_2: dict[str, OptionType] = {
    "model": OptionType("path"),
    "backend": OptionType("str", choices=("pytorch",)),
    "dtype": OptionType("str", choices=("auto", "float16", "bfloat16", "float32")),
    "tensor_parallel_size": _INT1,
    "pipeline_parallel_size": _INT1,
    "max_batch_size": _INT1,
    "max_input_len": _INT1,
    "max_seq_len": _INT1,
    "max_num_tokens": _INT1,
    "max_beam_width": _INT1,
    "enable_chunked_prefill": _BOOL,
    "kv_cache_config.enable_block_reuse": _BOOL,
    "kv_cache_config.free_gpu_memory_fraction": OptionType("float", minimum=0.0, maximum=1.0),
    "kv_cache_config.dtype": OptionType("str", choices=("auto", "fp8")),  # a free str upstream; these two are what we set
    "kv_cache_config.tokens_per_block": _INT1,
    "kv_cache_config.max_attention_window": OptionType("list[int]", minimum=1),
    "scheduler_config.capacity_scheduler_policy": OptionType("str", choices=("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")),
    "cuda_graph_config.enable_padding": _BOOL,
    "guided_decoding_backend": OptionType("str", choices=("xgrammar", "llguidance")),
    "stream_interval": _INT1,
    # LoraConfig (tensorrt_llm/lora_helper.py in 1.2) and PeftCacheConfig (llm_args.py): pipeline.backends.llmapi.lora
    "lora_config.lora_dir": OptionType("list[path]"),
    "lora_config.lora_ckpt_source": OptionType("str", choices=("hf", "nemo")),
    "lora_config.max_lora_rank": _INT1,
    "lora_config.lora_target_modules": OptionType(
        "list[str]", choices=("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate")
    ),
    "peft_cache_config.optimal_adapter_size": _INT1,
    "peft_cache_config.max_adapter_size": _INT1,
    "peft_cache_config.device_cache_percent": OptionType("float", minimum=0.0, maximum=1.0),
    "peft_cache_config.host_cache_size": OptionType("int", minimum=0),
}


@dataclass(frozen=True)
class LlmapiVersion:
    """One TensorRT-LLM release for the PyTorch path: its images and the LLM() options it accepts."""

    version: str
    triton_tag: str
    triton_tag_inferred: bool
    serve_image_inferred: bool
    source: str
    options: Mapping[str, OptionType] = field(repr=False)

    @property
    def triton_image(self) -> str:
        return TRITON_IMAGE.format(tag=self.triton_tag)

    @property
    def serve_image(self) -> str:
        return SERVE_IMAGE.format(version=self.version)

    def accepts(self, option: str) -> bool:
        return option in self.options


SUPPORTED_VERSIONS: Mapping[str, LlmapiVersion] = MappingProxyType(
    {
        "1.2.1": LlmapiVersion(
            "1.2.1",
            "26.02",
            True,
            True,
            "llm_args.py of the 1.2 era (tag v1.2.1 not read) [inf]; Triton tag as the engine profile [inf]; "
            "trtllm-serve image by NVIDIA's release:<version> pattern [inf]",
            MappingProxyType(dict(_OPTIONS_1_2)),
        ),
    }
)


def get_llmapi_version(version: str) -> LlmapiVersion:
    """The profile of `version`, or a SpecError naming build.trtllm_version, the target and the profiled releases."""
    key = str(version).strip()
    if key in SUPPORTED_VERSIONS:
        return SUPPORTED_VERSIONS[key]
    why = " (release candidates are not profiled: their LLM() options change from one rc to the next)" if "rc" in key else ""
    raise SpecError(
        f"build.trtllm_version {version!r} has no profile for build.target llmapi{why}; profiled: {', '.join(SUPPORTED_VERSIONS)}",
        hint=f"use {DEFAULT_VERSION}, or record the new release's TorchLlmArgs in pipeline/backends/llmapi/versions.py",
    )


def check_value(option: str, value: object, kind: OptionType) -> str | None:
    """Why `value` does not fit NVIDIA's field `option` (None when it does)."""
    if kind.kind.startswith("list["):
        item_kind = kind.kind[len("list[") : -1]
        if not isinstance(value, list) or not value:
            return f"{option}: expects a non-empty list of {item_kind} values, got {value!r}"
        item = OptionType(item_kind, choices=kind.choices, minimum=kind.minimum)
        problems = [check_value(option, entry, item) for entry in value]
        return next((p for p in problems if p is not None), None)
    kinds: dict[str, type | tuple[type, ...]] = {"str": str, "path": str, "int": int, "float": (int, float), "bool": bool}
    expected = kinds[kind.kind]
    if isinstance(value, bool) and kind.kind != "bool":
        return f"{option}: expects {kind.kind}, got a boolean"
    if not isinstance(value, expected):
        return f"{option}: expects {kind.kind}, got {type(value).__name__} {value!r}"
    if kind.choices and value not in kind.choices:
        return f"{option}: {value!r} is not one of {', '.join(kind.choices)}"
    if kind.minimum is not None and value < kind.minimum:  # type: ignore[operator]
        return f"{option}: must be >= {kind.minimum:g}, got {value}"
    if kind.maximum is not None and value > kind.maximum:  # type: ignore[operator]
        return f"{option}: must be <= {kind.maximum:g}, got {value}"
    return None

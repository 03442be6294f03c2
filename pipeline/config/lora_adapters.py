"""Facts about a Hugging Face PEFT LoRA adapter directory, read from its `adapter_config.json` (no weights loaded).

TensorRT-LLM maps PEFT module names to its own LoRA module ids (`lora_helper.get_default_trtllm_modules_to_hf_modules`:
attn_q ← q_proj, attn_k ← k_proj, attn_v ← v_proj, attn_dense ← o_proj, mlp_h_to_4h ← gate_proj,
mlp_4h_to_h ← down_proj, mlp_gate ← up_proj) and reads `r` as the adapter's rank. Phi-3's classes declare their own
map for its fused projections (NVIDIA/TensorRT-LLM tensorrt_llm/models/phi3/model.py and
tensorrt_llm/_torch/models/modeling_phi3.py, `trtllm_modules_to_hf_modules`): attn_qkv ← qkv_proj, attn_dense ← o_proj,
mlp_h_to_4h ← gate_up_proj (lora_B's halves swapped to TensorRT-LLM's [up; gate] by LoraManager.load_from_hf),
mlp_4h_to_h ← down_proj. A module the model does not have is refused by the adapter checks (lora_checks.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import SpecError

if TYPE_CHECKING:
    from pipeline.config.spec import LoraSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"

HF_TO_TRTLLM_MODULE = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate",
    "qkv_proj": "attn_qkv",  # Phi-3's fused q/k/v
    "gate_up_proj": "mlp_h_to_4h",  # Phi-3's fused MLP input
}
_LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj")
# PEFT's shorthand for every linear layer but the output head.
_ALL_LINEAR = "all-linear"


class AdapterError(ValueError):
    """An adapter directory this pipeline cannot use; the message names the file."""


@dataclass(frozen=True)
class AdapterInfo:
    path: Path
    rank: int
    target_modules: tuple[str, ...]  # TensorRT-LLM module ids, in PEFT's order
    has_weights: bool  # adapter_model.safetensors present
    pickled_only: bool  # adapter_model.bin without adapter_model.safetensors
    varies_rank: bool = False  # rank_pattern gives some modules a rank other than r


def read_adapter(path: Path) -> AdapterInfo:
    """Read `path/adapter_config.json`; AdapterError for a missing or unusable adapter."""
    config_file = path / ADAPTER_CONFIG
    if not path.is_dir():
        raise AdapterError(f"LoRA adapter directory not found: {path}")
    if not config_file.is_file():
        raise AdapterError(f"{path} has no {ADAPTER_CONFIG}; it is not a Hugging Face PEFT adapter directory")
    try:
        config: Any = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{config_file}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_file}: must be a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterError(f"{config_file}: peft_type {peft_type} is not LORA")
    if config.get("use_dora"):
        raise AdapterError(f"{config_file}: use_dora is true; DoRA adapters need trtllm-build's dora_plugin, which this pipeline does not enable")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{config_file}: r (the adapter rank) must be a positive integer, got {rank!r}")
    return AdapterInfo(
        path=path,
        rank=rank,
        target_modules=_trtllm_modules(config.get("target_modules"), config_file),
        has_weights=(path / ADAPTER_WEIGHTS).is_file(),
        pickled_only=(path / PICKLED_WEIGHTS).is_file() and not (path / ADAPTER_WEIGHTS).is_file(),
        varies_rank=bool(config.get("rank_pattern")),
    )


def engine_target_modules(declared: Sequence[str], adapter_dirs: Sequence[str]) -> tuple[str, ...]:
    """The engine's LoRA modules: build.lora.target_modules, or when it is empty the first adapter's (AdapterError when
    that adapter cannot be read)."""
    if declared or not adapter_dirs:
        return tuple(declared)
    return read_adapter(Path(adapter_dirs[0])).target_modules


def spec_target_modules(lora: LoraSpec) -> tuple[str, ...]:
    """engine_target_modules of a build.lora section; a SpecError naming build.lora.adapter_dirs when the first
    adapter, which then defines them, cannot be read."""
    try:
        return engine_target_modules([module.value for module in lora.target_modules], lora.adapter_dirs)
    except AdapterError as exc:
        raise SpecError(f"build.lora.adapter_dirs: {exc}") from None


def _trtllm_modules(value: Any, config_file: Path) -> tuple[str, ...]:
    if value == _ALL_LINEAR:
        return tuple(HF_TO_TRTLLM_MODULE[name] for name in _LLAMA_MODULES)
    if isinstance(value, str):
        raise AdapterError(
            f"{config_file}: target_modules is the pattern {value!r}; list the module names (q_proj, k_proj, ...) so the "
            "engine's LoRA modules can be checked against it"
        )
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        raise AdapterError(f"{config_file}: target_modules must be a non-empty list of module names, got {value!r}")
    unknown = [name for name in value if name not in HF_TO_TRTLLM_MODULE]
    if unknown:
        raise AdapterError(
            f"{config_file}: target_modules {', '.join(unknown)} have no TensorRT-LLM LoRA module for a Llama- or "
            f"Phi-3-family decoder (known: {', '.join(HF_TO_TRTLLM_MODULE)})"
        )
    ordered = dict.fromkeys(HF_TO_TRTLLM_MODULE[name] for name in value)
    return tuple(ordered)

"""build.lora and serve.lora on the llmapi target: the LoRA options of `LLM()` (TensorRT-LLM 1.2's PyTorch backend)
and where the adapters go. Field names: tests/data/llmapi_1_2_1_llm_args.json (`lora`).

- build.lora → `lora_config` (LoraConfig): lora_dir, lora_ckpt_source, max_lora_rank, lora_target_modules (the
  modules build.lora lists, else the first adapter's). The build links each adapter of build.lora.adapter_dirs
  into `<engine>/lora/<i>/` (adapter_config.json + adapter_model.safetensors), inside the directory LLM() loads,
  as trtllm-build copies them into `<engine>/lora/<i>/`; lora_dir names them there.
- serve.lora → `peft_cache_config` (PeftCacheConfig): optimal_adapter_size, max_adapter_size, device_cache_percent
  (a fraction, despite its name), host_cache_size: the fields NVIDIA's Triton model fills from the same
  lora_cache_* parameters, with the engine target's defaults (max_adapter_size: build.lora.max_rank).
  LoraConfig's max_loras / max_cpu_loras stay unset: the PyTorch backend then sizes its adapter caches from
  peft_cache_config alone (with them it overrides the cache's module-layer counts).

Per request an adapter is chosen by a `LoRARequest(lora_name, lora_int_id, lora_path)`; lora_path is a directory on
the server, `<model>/lora/<i>` for the i-th entry of build.lora.adapter_dirs. trtllm-serve reads it from the
`lora_request` object of a /v1/completions or /v1/chat/completions body; the Triton llmapi model of this project
from NVIDIA's lora_name / lora_id / lora_path inputs (model_repo/python/tensorrt_llm_llmapi.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.backends.llm_parameters import lora_cache
from pipeline.config.lora_adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, spec_target_modules
from pipeline.config.spec import ServeSpec, Spec
from pipeline.errors import StageError

LORA_DIR = "lora"  # the adapters inside the served model directory: <model>/lora/<i>/


def lora_options(spec: Spec) -> dict[str, Any]:
    """{"lora_config": ...} for build.lora (lora_dir relative to the served model directory), {} without it."""
    lora = spec.build.lora
    if lora is None:
        return {}
    modules = spec_target_modules(lora)
    config: dict[str, Any] = {"lora_dir": [f"{LORA_DIR}/{index}" for index in range(len(lora.adapter_dirs))]} if lora.adapter_dirs else {}
    config.update(lora_ckpt_source=lora.adapter_source.value, max_lora_rank=lora.max_rank, lora_target_modules=list(modules))
    return {"lora_config": config}


def peft_cache_options(serve: ServeSpec, max_lora_rank: int) -> dict[str, Any]:
    """{"peft_cache_config": ...}: serve.lora's cache sizes (or their defaults) for adapters up to `max_lora_rank`."""
    optimal, largest, fraction, host_bytes = lora_cache(serve, max_lora_rank)
    return {
        "peft_cache_config": {"optimal_adapter_size": optimal, "max_adapter_size": largest, "device_cache_percent": fraction, "host_cache_size": host_bytes}
    }


def served_lora_options(build: Mapping[str, Any], serve: ServeSpec, model_path: str) -> dict[str, Any]:
    """The LoRA options of the served forms: lora_config with lora_dir under `model_path`, and peft_cache_config;
    {} when the build rendered no lora_config."""
    lora = build.get("lora_config")
    if not isinstance(lora, Mapping):
        return {}
    dirs = {"lora_dir": [f"{model_path}/{entry}" for entry in lora["lora_dir"]]} if "lora_dir" in lora else {}
    return {"lora_config": {**lora, **dirs}, **peft_cache_options(serve, int(lora["max_lora_rank"]))}


def lora_option_fields(spec: Spec) -> dict[str, tuple[str, Any]]:
    """Dotted LLM() option → (the spec field that sets it, value), for the version profile's checks."""
    lora = spec.build.lora
    if lora is None:
        return {}
    config = lora_options(spec)["lora_config"]
    fields = {
        "lora_dir": "build.lora.adapter_dirs",
        "lora_ckpt_source": "build.lora.adapter_source",
        "max_lora_rank": "build.lora.max_rank",
        "lora_target_modules": "build.lora.target_modules",
    }
    flat = {f"lora_config.{key}": (fields[key], value) for key, value in config.items()}
    cache = peft_cache_options(spec.serve, lora.max_rank)["peft_cache_config"]
    for key, value in cache.items():
        flat[f"peft_cache_config.{key}"] = ("serve.lora", value)
    return flat


def link_adapters(spec: Spec, engine_dir: Path) -> int:
    """Hard-link (or copy) each adapter's config and safetensors into `<engine_dir>/lora/<i>/`; returns the count."""
    lora = spec.build.lora
    count = 0
    for index, directory in enumerate(lora.adapter_dirs if lora is not None else ()):
        target = engine_dir / LORA_DIR / str(index)
        target.mkdir(parents=True, exist_ok=True)
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            source = Path(directory) / name
            if not source.is_file():
                raise StageError(
                    f"build.lora.adapter_dirs[{index}]: {source} is missing; LLM() loads the adapter's "
                    f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (a dry run needs only the config)"
                )
            try:
                os.link(source, target / name)
            except OSError:
                shutil.copy2(source, target / name)
            count += 1
    return count

"""The cpu `tensorrt_llm` model's LoRA parameters: the cache sizes (lora_cache_*) and the prefetch directory.

`lora_cache_max_adapter_size` / `lora_cache_host_memory_bytes` size refengine's LoRA cache as they size TensorRT-LLM's
PeftCacheManager (the GPU-only lora_cache_optimal_adapter_size / lora_cache_gpu_memory_fraction have nothing to size
here). `lora_prefetch_dir` is TensorRT-LLM's layout (`PeftCacheManager::prefetchLoraWeights`): one folder per task id,
`<dir>/<task_id>/model.lora_weights.npy` + `model.lora_config.npy`, loaded before the first request; a folder whose name
is not a number is skipped with a warning, as TensorRT-LLM skips it; a missing directory loads nothing. An adapter that
does not fit the model or the cache stops the model from loading, naming the folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from model_parameters import ModelParameters

from refengine import InvalidRequestError, LLMEngine, LoraSettings

WEIGHTS_FILE, CONFIG_FILE = "model.lora_weights.npy", "model.lora_config.npy"


def lora_settings(parameters: ModelParameters, engine_dir: Path) -> LoraSettings | None:
    """The engine's LoRA settings (its build_config's modules and max_lora_rank) with the model parameters' cache sizes;
    None for an engine built without LoRA, which takes no adapter (as a TensorRT-LLM engine without the LoRA plugin)."""
    build_config = json.loads((engine_dir / "config.json").read_text(encoding="utf-8")).get("build_config") or {}
    built = LoraSettings.from_build_config(build_config)
    if built is None:
        return None
    return dataclasses.replace(
        built,
        max_adapter_size=parameters.integer("lora_cache_max_adapter_size", built.max_adapter_size),
        host_memory_bytes=parameters.integer("lora_cache_host_memory_bytes", built.host_memory_bytes),
    )


def prefetch_adapters(engine: LLMEngine, directory: Path, warn) -> list[int]:
    """Load every `<directory>/<task_id>/` adapter into the engine's LoRA cache; the task ids loaded, in order."""
    if not directory.is_dir():
        return []
    loaded = []
    for folder in sorted(directory.iterdir(), key=lambda path: path.name):
        if not folder.is_dir():
            continue
        if not folder.name.isdigit():
            warn(f"lora_prefetch_dir: {folder} is skipped: its name is not a LoRA task id (a number)")
            continue
        try:
            weights = np.load(folder / WEIGHTS_FILE, allow_pickle=False)
            config = np.load(folder / CONFIG_FILE, allow_pickle=False)
            engine.load_lora_adapter(int(folder.name), weights, config)
        except (OSError, ValueError, InvalidRequestError) as error:
            raise ValueError(f"lora_prefetch_dir: adapter {folder}: {error}") from None
        loaded.append(int(folder.name))
    return loaded

"""refengine: the project's CPU reference engine for TensorRT-LLM checkpoints.

It loads a TensorRT-LLM checkpoint or CPU engine directory (of an architecture listed in
`refengine.architectures`), and serves it with inflight batching over a paged KV cache: a
token-budget scheduler with chunked prefill, prefix reuse and preemption, and a float32 model
whose greedy output matches transformers.

    from refengine import LLMEngine, SamplingParams
    engine = LLMEngine.from_engine_dir("artifacts/.../engine")
    [out] = engine.generate([[1, 15043]], SamplingParams(max_tokens=8, temperature=0))

This package never imports `pipeline` or `clients`.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

# Public name -> its module, imported on first use: `refengine.architectures` (torch-free) is read
# by the pipeline's validation, which must not load torch through this package's import.
PUBLIC_NAMES = MappingProxyType(
    {
        "Checkpoint": "refengine.checkpoint",
        "CompletionOutput": "refengine.outputs",
        "EngineConfig": "refengine.config",
        "EngineConfigError": "refengine.errors",
        "EngineDirectory": "refengine.checkpoint",
        "EngineLoop": "refengine.engine_loop",
        "EngineStats": "refengine.stats",
        "InvalidRequestError": "refengine.errors",
        "KVCacheUsage": "refengine.kv_cache",
        "LLMEngine": "refengine.engine",
        "LoraRequest": "refengine.lora.request",
        "LoraSettings": "refengine.lora.settings",
        "ModelConfig": "refengine.model_config",
        "ModelLoadError": "refengine.errors",
        "RefEngineError": "refengine.errors",
        "RequestMetrics": "refengine.outputs",
        "RequestOutput": "refengine.outputs",
        "RequestStream": "refengine.engine_loop",
        "SamplingParams": "refengine.sampling",
        "SchedulerPolicy": "refengine.config",
        "TokenLogprob": "refengine.outputs",
        "load_checkpoint": "refengine.checkpoint",
        "load_engine_dir": "refengine.checkpoint",
        "write_engine_dir": "refengine.checkpoint",
    }
)


def __getattr__(name: str) -> Any:
    module = PUBLIC_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'refengine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC_NAMES))


__all__ = list(PUBLIC_NAMES)

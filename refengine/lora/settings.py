"""The LoRA cache's sizes and the modules LoRA may adapt: TensorRT-LLM's names and meanings. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from refengine.errors import EngineConfigError
from refengine.lora.modules import LORA_MODULE_IDS


@dataclass(frozen=True)
class LoraSettings:
    """- `max_adapter_size`: the largest rank a row may have (the Triton parameter lora_cache_max_adapter_size; TensorRT-LLM's
      PeftCacheManager caps it at the build's max_lora_rank, and refuses a larger rank: "Invalid low_rank").
    - `host_memory_bytes`: what the cached adapters may hold together (lora_cache_host_memory_bytes), counted as TensorRT-LLM
      stores them: rank × (in + out) values per row, at the element size of the weights sent.
    - `max_adapters`: at most this many adapters cached (the PyTorch backend's LoraConfig.max_cpu_loras); None: bytes only.
    - `target_modules`: the build's lora_target_modules (TensorRT-LLM module names); None: every module the model has.
    """

    max_adapter_size: int = 64
    host_memory_bytes: int = 1 << 30
    max_adapters: int | None = None
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_adapter_size", "host_memory_bytes") + (("max_adapters",) if self.max_adapters is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise EngineConfigError(f"lora.{name}", f"must be a positive integer, got {value!r}")
        if self.target_modules is not None:
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            unknown = [name for name in self.target_modules if name not in LORA_MODULE_IDS]
            if unknown:
                raise EngineConfigError(
                    "lora.target_modules", f"{', '.join(map(str, unknown))} are not TensorRT-LLM LoRA modules (known: {', '.join(LORA_MODULE_IDS)})"
                )

    @classmethod
    def from_build_config(cls, build_config: Mapping[str, Any]) -> LoraSettings | None:
        """The settings an engine built with LoRA says (`plugin_config.lora_plugin` set; `lora_config`'s max_lora_rank and
        lora_target_modules), or None when it says nothing."""
        plugin = build_config.get("plugin_config") or {}
        lora_config = build_config.get("lora_config") or {}
        if not plugin.get("lora_plugin") or not lora_config:
            return None
        modules = lora_config.get("lora_target_modules") or None
        return cls(max_adapter_size=int(lora_config.get("max_lora_rank", 64)), target_modules=tuple(modules) if modules else None)

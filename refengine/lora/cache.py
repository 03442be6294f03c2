"""The LoRA adapter cache, with TensorRT-LLM's semantics (`batch_manager/peftCacheManager.cpp`, `runtime/loraCache.cpp`).

- A task id with weights and config: the adapter is checked, loaded and kept under the id after its request.
- A task id alone: the adapter must be cached, else the request fails with TensorRT-LLM's text
  "LoRA task N not found in cache. Please send LoRA weights with request".
- Every request in flight pins its adapter; room for a new one is made by evicting the least recently used adapters
  that no request pins (TensorRT-LLM evicts its "done" tasks). When the pinned ones leave no room, the new request fails:
  "PEFT Cache is full. Could not store taskId=N" (TensorRT-LLM's), and nothing else changes.
- A task id sent again with the same weights is the cached adapter. With other weights it is refused: TensorRT-LLM
  keeps the cached copy and ignores the new weights without a word (`LoraCache::put` of a present task only bumps it),
  so a client that reuses an id would silently get the old adapter's output.

Every check runs before anything changes, so a refused request leaves the cache as it was.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from refengine.errors import InvalidRequestError
from refengine.lora.adapter import LoraAdapter, build_adapter
from refengine.lora.modules import ModelLoraShape, module_targets
from refengine.lora.request import TASK_ID, WEIGHTS, LoraRequest, check_task_id, parse_adapter
from refengine.lora.settings import LoraSettings


@dataclass
class _Entry:
    adapter: LoraAdapter
    pins: int = 0


class LoraCache:
    def __init__(self, shape: ModelLoraShape, settings: LoraSettings, dtype: torch.dtype) -> None:
        self.shape = shape
        self.settings = settings
        self.targets = module_targets(shape, settings.target_modules)
        self._dtype = dtype
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first

    @property
    def task_ids(self) -> tuple[int, ...]:
        """Cached task ids, least recently used first."""
        return tuple(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(entry.adapter.nbytes for entry in self._entries.values())

    def pins(self, task_id: int) -> int:
        entry = self._entries.get(task_id)
        return 0 if entry is None else entry.pins

    def acquire(self, request: LoraRequest) -> LoraAdapter:
        """The request's adapter, loaded if it came with weights, pinned until `release`."""
        adapter = self._resolve(request)
        self._entries[adapter.task_id].pins += 1
        return adapter

    def release(self, task_id: int) -> None:
        entry = self._entries.get(task_id)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1

    def load(self, request: LoraRequest) -> LoraAdapter:
        """Cache an adapter without pinning it (TensorRT-LLM's lora_prefetch_dir)."""
        if request.weights is None:
            raise InvalidRequestError(WEIGHTS, "is missing: loading an adapter needs its weights and config")
        return self._resolve(request)

    def _resolve(self, request: LoraRequest) -> LoraAdapter:
        task_id = check_task_id(request)
        entry = self._entries.get(task_id)
        if request.weights is None:
            if entry is None:
                raise InvalidRequestError(TASK_ID, f"LoRA task {task_id} not found in cache. Please send LoRA weights with request")
            self._entries.move_to_end(task_id)
            return entry.adapter
        parsed = parse_adapter(request, self.targets, self.shape.num_layers, self.settings.max_adapter_size)
        if entry is not None:
            if entry.adapter.digest != parsed.digest:
                raise InvalidRequestError(
                    TASK_ID, f"LoRA task {task_id} is cached with other weights; send these under a new lora_task_id (or the cached adapter's id alone)"
                )
            self._entries.move_to_end(task_id)
            return entry.adapter
        self._make_room(task_id, parsed.nbytes)
        adapter = build_adapter(task_id, parsed, self.targets, self._dtype)
        self._entries[task_id] = _Entry(adapter)
        return adapter

    def _make_room(self, task_id: int, nbytes: int) -> None:
        """Evict least recently used unpinned adapters until `nbytes` more fit; refuse (evicting nothing) if they cannot."""
        budget, most = self.settings.host_memory_bytes, self.settings.max_adapters
        if nbytes > budget:
            raise InvalidRequestError(
                WEIGHTS,
                f"the adapter of LoRA task {task_id} holds {nbytes} bytes, more than the whole LoRA cache ({budget} bytes, lora_cache_host_memory_bytes)",
            )
        evictable = [tid for tid, entry in self._entries.items() if entry.pins == 0]
        held, count, victims = self.nbytes, len(self._entries), []
        while (held + nbytes > budget or (most is not None and count + 1 > most)) and evictable:
            victim = evictable.pop(0)
            victims.append(victim)
            held -= self._entries[victim].adapter.nbytes
            count -= 1
        if held + nbytes > budget or (most is not None and count + 1 > most):
            in_flight = sum(1 for entry in self._entries.values() if entry.pins)
            raise InvalidRequestError(
                TASK_ID,
                f"PEFT Cache is full. Could not store taskId={task_id}: {in_flight} adapters in flight "
                f"hold the cache ({self.nbytes} of {budget} bytes" + (f", at most {most} adapters" if most is not None else "") + ")",
            )
        for victim in victims:
            del self._entries[victim]

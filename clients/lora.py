"""A LoRA adapter as a request sends it: NVIDIA's `lora_task_id`, and `lora_weights` / `lora_config` (lora_tensors.py).

TensorRT-LLM keeps an adapter under its task id once a request has carried its weights; later requests send the id
alone, and an id the server has not cached (never sent, evicted, or the server restarted) is refused ("LoRA task N not
found in cache. Please send LoRA weights with request"). `LoraAdapter.from_dir` reads a PEFT adapter directory
(converted on the way) or a directory of `model.lora_weights.npy` + `model.lora_config.npy` (`trtllm-pipeline lora
convert`'s, or NVIDIA's hf_lora_convert.py's). Without a task id it gets one from the tensors' digest, so the same
adapter has the same id in every client and two different adapters do not share one. `SentAdapters` remembers which
ids a client has sent weights for.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from clients.errors import InvalidRequestError
from clients.lora_tensors import ADAPTER_CONFIG, WEIGHTS_FILE, convert_peft_adapter, read_lora_tensors

NOT_CACHED = "not found in cache"  # TensorRT-LLM's refusal of an uncached task id
MAX_TASK_ID = 2**64 - 1


@dataclass(frozen=True)
class LoraAdapter:
    task_id: int
    weights: NDArray[Any] | None = field(default=None, repr=False)  # [1, rows, values]; None: an adapter the server has cached
    config: NDArray[Any] | None = field(default=None, repr=False)  # [1, rows, 3] int32

    def __post_init__(self) -> None:
        if isinstance(self.task_id, bool) or not isinstance(self.task_id, int | np.integer) or not 0 <= self.task_id <= MAX_TASK_ID:
            raise InvalidRequestError("lora_task_id", f"lora_task_id must be an unsigned 64-bit integer, got {self.task_id!r}")

    @classmethod
    def from_dir(cls, directory: Path | str, task_id: int | None = None, *, dtype: str = "float16") -> LoraAdapter:
        """The adapter in `directory` (PEFT, converted to `dtype`; or converted .npy files, as they are)."""
        directory = Path(directory)
        if (directory / WEIGHTS_FILE).is_file():
            tensors = read_lora_tensors(directory)
        elif (directory / ADAPTER_CONFIG).is_file():
            tensors = convert_peft_adapter(directory, dtype)
        else:
            raise InvalidRequestError("lora_dir", f"lora_dir {directory} holds neither a PEFT adapter ({ADAPTER_CONFIG}) nor a converted one ({WEIGHTS_FILE})")
        return cls(digest_task_id(tensors.weights, tensors.config) if task_id is None else task_id, tensors.weights, tensors.config)

    def inputs(self, *, with_weights: bool) -> dict[str, Any]:
        """The request's LoRA inputs: the task id, and the tensors when `with_weights`."""
        values: dict[str, Any] = {"lora_task_id": int(self.task_id)}
        if with_weights and self.weights is not None:
            values.update(lora_weights=self.weights, lora_config=self.config)
        return values


def digest_task_id(weights: NDArray[Any], config: NDArray[Any]) -> int:
    """A task id (1 .. 2**63 - 1) from the adapter's bytes: equal adapters, equal ids."""
    digest = hashlib.blake2b(digest_size=8)
    for array in (config, weights):
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return int.from_bytes(digest.digest(), "big") % (2**63 - 1) + 1


class SentAdapters:
    """The task ids whose weights a client has sent (thread-safe): the first request of an adapter carries its weights."""

    def __init__(self) -> None:
        self._sent: set[int] = set()
        self._lock = threading.Lock()

    def needs_weights(self, adapter: LoraAdapter) -> bool:
        """True the first time (and marks it sent); False afterwards, until `forget`."""
        with self._lock:
            first = adapter.task_id not in self._sent
            self._sent.add(adapter.task_id)
            return first

    def forget(self, adapter: LoraAdapter) -> None:
        with self._lock:
            self._sent.discard(adapter.task_id)

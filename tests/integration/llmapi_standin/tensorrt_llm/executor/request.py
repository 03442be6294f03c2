"""Stand-in for `tensorrt_llm.executor.request.LoRARequest`: the three fields NVIDIA's class has, and its refusal of
a lora_path that does not exist."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")

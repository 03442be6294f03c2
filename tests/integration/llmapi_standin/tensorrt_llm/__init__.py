"""A stand-in for TensorRT-LLM's `LLM` / `SamplingParams`, copied beside model.py by
tests/integration/test_llmapi_repository.py so that the llmapi target's model code (model_repo/python/
tensorrt_llm_llmapi.py) runs in the real tritonserver on a machine without TensorRT-LLM. It generates no language:
step i of a request appends the word " w<i>" (" <adapter name>-w<i>" under a LoRA adapter), so a client can check
what it received. It refuses options the rendered model.yaml would not hold, so the test also shows model.yaml
reached `LLM(**options)`, and an adapter unless model.yaml has a lora_config and its directory a PEFT config."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

STEP_S = 0.002


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    best_of: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    exclude_input_from_output: bool = True


@dataclass
class _Completion:
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | None = None


class _Output:
    def __init__(self, completion: _Completion) -> None:
        self.outputs = [completion]


class _Result:
    def __init__(self, params: SamplingParams, word: str) -> None:
        self.outputs = [_Completion()]
        self._params = params
        self._word = word
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self):
        return self._steps()

    async def _steps(self):
        completion = self.outputs[0]
        for step in range(self._params.max_tokens):
            if self.aborted:
                return
            await asyncio.sleep(STEP_S)
            completion.text += f" {self._word}{step}"
            if step == self._params.max_tokens - 1:
                completion.finish_reason = "length"
            yield _Output(completion)


class LLM:
    def __init__(self, model: str, backend: str, **options) -> None:
        if backend != "pytorch" or "kv_cache_config" not in options or "max_batch_size" not in options:
            raise ValueError(f"not the rendered model.yaml: backend {backend!r}, options {sorted(options)}")
        self.model = model
        self.options = options

    def generate_async(self, prompt: str, sampling_params: SamplingParams, streaming: bool = False, lora_request=None) -> _Result:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("a prompt is a non-empty string")
        if lora_request is None:
            return _Result(sampling_params, "w")
        if "lora_config" not in self.options:
            raise ValueError("a LoRA request to an LLM without lora_config")
        with open(os.path.join(lora_request.lora_path, "adapter_config.json"), encoding="utf-8") as handle:
            json.load(handle)
        return _Result(sampling_params, f"{lora_request.lora_name}-w")

    def shutdown(self) -> None:
        return None

"""Triton Python model `tensorrt_llm` for the llmapi target: TensorRT-LLM's `LLM()` (the PyTorch backend) behind
the tensor contract of NVIDIA's `llmapi` model (triton_backend/all_models/llmapi), written for this project.

- `initialize` reads `model.yaml` next to this file (or $LLM_CONFIG_PATH): every key but `triton_config` is an
  `LLM()` argument, as in NVIDIA's model. It imports tensorrt_llm (only the GPU image has it) and starts the
  LLM with an asyncio loop on a background thread.
- `execute` reads `text_input` and the `sampling_param_*` inputs of each request, submits
  `LLM.generate_async`, and sends `text_output` (+ `finish_reason`, `stop_reason`): one response per new text
  chunk when the request asks for `streaming` (decoupled), one final response otherwise.
- `lora_id`, `lora_name` and `lora_path` together select a LoRA adapter (TensorRT-LLM's `LoRARequest`; the LLM
  caches it by id, loading it from `lora_path`, a directory on this server: `<model>/lora/<i>` for the build's
  adapters), when model.yaml has a `lora_config` (build.lora). `lora_ckpt_source` may only say `hf`.
- Cancelled requests are aborted; a bad request gets an INVALID_ARG error, the model stays up.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# input name -> SamplingParams field
_SAMPLING = {
    "sampling_param_best_of": "best_of",
    "sampling_param_temperature": "temperature",
    "sampling_param_top_k": "top_k",
    "sampling_param_top_p": "top_p",
    "sampling_param_frequency_penalty": "frequency_penalty",
    "sampling_param_presence_penalty": "presence_penalty",
    "sampling_param_max_tokens": "max_tokens",
    "sampling_param_seed": "seed",
}


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)
    if value.size != 1:
        raise ValueError(f"{name} must hold one value, got {value.size}")
    item = value[0].item() if isinstance(value[0], np.generic) else value[0]  # STRING tensors hold bytes objects
    return item.decode("utf-8") if isinstance(item, bytes) else item


def _strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def _response(text: str, finish_reason, stop_reason):
    def tensor(name: str, value) -> pb_utils.Tensor:
        return pb_utils.Tensor(name, np.array([("" if value is None else str(value)).encode("utf-8")], dtype=object))

    outputs = [tensor("text_output", text), tensor("finish_reason", finish_reason), tensor("stop_reason", stop_reason)]
    return pb_utils.InferenceResponse(output_tensors=outputs)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = os.environ.get("LLM_CONFIG_PATH") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.yaml")
        with open(path, encoding="utf-8") as handle:
            options = yaml.safe_load(handle)
        options.pop("triton_config", None)
        from tensorrt_llm import LLM, SamplingParams  # the GPU image's TensorRT-LLM; absent anywhere else
        from tensorrt_llm.executor.request import LoRARequest

        self._sampling_params = SamplingParams
        self._lora_request = LoRARequest
        self._serves_lora = "lora_config" in options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmapi-loop", daemon=True)
        self._thread.start()
        self._llm = LLM(**options)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                prompt, params, streaming = self._parse(request)
                lora = self._adapter(request)
            except (ValueError, TypeError) as error:
                failure = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
                if self.decoupled:
                    request.get_response_sender().send(failure, flags=FINAL)
                else:
                    responses.append(failure)
                continue
            future = asyncio.run_coroutine_threadsafe(self._generate(request, prompt, params, streaming, lora), self._loop)
            if not self.decoupled:
                responses.append(future.result())
        return None if self.decoupled else responses

    def _parse(self, request):
        prompts = _strings(request, "text_input")
        if not prompts or len(prompts) != 1:
            raise ValueError("text_input must hold one prompt (the model takes one request per call)")
        fields = {field: _scalar(request, name) for name, field in _SAMPLING.items()}
        fields = {field: value for field, value in fields.items() if value is not None}
        stop = _strings(request, "sampling_param_stop")
        if stop:
            fields["stop"] = stop
        exclude = _scalar(request, "sampling_param_exclude_input_from_output")
        if exclude is not None:
            fields["exclude_input_from_output"] = bool(exclude)
        streaming = bool(_scalar(request, "streaming") or False)
        if streaming and not self.decoupled:
            raise ValueError("streaming needs the decoupled transaction policy (serve.decoupled: true)")
        return prompts[0], self._sampling_params(**fields), streaming

    def _adapter(self, request):
        """The request's LoRARequest, or None when it names no adapter."""
        selection = {name: _scalar(request, name) for name in ("lora_id", "lora_name", "lora_path")}
        source = _scalar(request, "lora_ckpt_source")
        given = [name for name, value in selection.items() if value is not None]
        if not given and source is None:
            return None
        if len(given) < len(selection):
            missing = [name for name in selection if name not in given]
            raise ValueError(f"{', '.join(missing)} missing: an adapter is chosen by lora_id, lora_name and lora_path together")
        if not self._serves_lora:
            raise ValueError("lora_id / lora_name / lora_path: this model serves no LoRA adapter (its model.yaml has no lora_config: build it with build.lora)")
        if source not in (None, "hf"):
            raise ValueError(
                f"lora_ckpt_source {source!r}: only hf (PEFT adapter_config.json + adapter_model.safetensors) is served; a .nemo archive holds pickled weights"
            )
        path = selection["lora_path"]
        if not os.path.isdir(path):
            raise ValueError(f"lora_path {path!r} is not a directory on this server (the build's adapters are at <model>/lora/<i>)")
        return self._lora_request(selection["lora_name"], int(selection["lora_id"]), path)

    async def _generate(self, request, prompt, params, streaming, lora):
        sender = request.get_response_sender() if self.decoupled else None
        result = self._llm.generate_async(prompt, sampling_params=params, streaming=streaming, lora_request=lora)
        sent = 0
        async for output in result:
            if request.is_cancelled():
                result.abort()
                break
            completion = output.outputs[0]
            if streaming:
                sender.send(_response(completion.text[sent:], completion.finish_reason, completion.stop_reason))
                sent = len(completion.text)
        completion = result.outputs[0]
        final = _response("" if streaming else completion.text, completion.finish_reason, completion.stop_reason)
        if sender is None:
            return final
        sender.send(final, flags=FINAL)
        return None

    def finalize(self):
        llm = getattr(self, "_llm", None)
        if llm is not None:
            llm.shutdown()
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

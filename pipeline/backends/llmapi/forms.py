"""The two forms the llmapi target renders from the same LLM() options (pipeline.backends.llmapi.options):

- NVIDIA's Triton `llmapi` model repository: one model, `tensorrt_llm`, whose `1/model.yaml` holds the LLM()
  arguments plus `triton_config` (NVIDIA's model.py reads `triton_config.max_batch_size` and `.decoupled` in
  auto_complete_config and hands every other key to `LLM(**args)` through update_llm_args_with_extra_dict), and
  whose `config.pbtxt` declares the tensors of NVIDIA's template (triton_backend/all_models/llmapi/tensorrt_llm/
  config.pbtxt) that the model code here serves. Clients call `/v2/models/tensorrt_llm/generate` with
  `text_input` and `sampling_param_*` inputs: another contract than the ensemble's (text_input, max_tokens, ...).
- `trtllm-serve MODEL --backend pytorch --extra_llm_api_options FILE`: the OpenAI-compatible server
  (/v1/completions, /v1/chat/completions, /health, /metrics). Its YAML holds every option but `model` (the
  positional argument) and `backend` (the flag); NVIDIA's help says the YAML "overwrites the parameters
  specified by trtllm-serve", so the command line carries nothing the YAML also sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

LLM_MODEL = "tensorrt_llm"
MODEL_YAML = "model.yaml"
SERVE_OPTIONS_FILE = "extra-llm-api-config.yml"
TRTLLM_SERVE = "trtllm-serve"
OPENAI_CONTAINER_PORT = 8000  # trtllm-serve's default --port

# (name, Triton data type, dims, optional) as NVIDIA's llmapi config.pbtxt declares them. Left out: image_url
# (multimodal), return_cumulative_logprob / sampling_param_return_perf_metrics and the kv-cache / timing / draft
# outputs they fill (this model does not compute them). lora_id / lora_name / lora_path (+ lora_ckpt_source) select
# an adapter per request (pipeline.backends.llmapi.lora).
LLMAPI_INPUTS: tuple[tuple[str, str, str, bool], ...] = (
    ("text_input", "TYPE_STRING", "[ -1 ]", False),
    ("streaming", "TYPE_BOOL", "[ 1 ]", True),
    ("sampling_param_best_of", "TYPE_INT32", "[ 1 ]", True),
    ("sampling_param_temperature", "TYPE_FP32", "[ 1 ]", True),
    ("sampling_param_top_k", "TYPE_INT32", "[ 1 ]", True),
    ("sampling_param_top_p", "TYPE_FP32", "[ 1 ]", True),
    ("sampling_param_frequency_penalty", "TYPE_FP32", "[ 1 ]", True),
    ("sampling_param_presence_penalty", "TYPE_FP32", "[ 1 ]", True),
    ("sampling_param_max_tokens", "TYPE_INT32", "[ 1 ]", True),
    ("sampling_param_stop", "TYPE_STRING", "[ -1 ]", True),
    ("sampling_param_seed", "TYPE_UINT64", "[ 1 ]", True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", "[ 1 ]", True),
    ("return_finish_reason", "TYPE_BOOL", "[ 1 ]", True),
    ("return_stop_reason", "TYPE_BOOL", "[ 1 ]", True),
    ("lora_id", "TYPE_UINT64", "[ 1 ]", True),
    ("lora_name", "TYPE_STRING", "[ 1 ]", True),
    ("lora_path", "TYPE_STRING", "[ 1 ]", True),
    ("lora_ckpt_source", "TYPE_STRING", "[ 1 ]", True),
)
LLMAPI_OUTPUTS: tuple[tuple[str, str, str], ...] = (
    ("text_output", "TYPE_STRING", "[ -1 ]"),
    ("finish_reason", "TYPE_STRING", "[ -1 ]"),
    ("stop_reason", "TYPE_STRING", "[ -1 ]"),
)


def model_yaml(options: Mapping[str, Any], *, model_path: str, decoupled: bool) -> str:
    """tensorrt_llm/1/model.yaml: `model`, the LLM() options, then NVIDIA's triton_config (max_batch_size 0: the
    model takes one request per call and LLM() batches them; decoupled: streaming responses)."""
    document = {"model": model_path, **options, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}
    header = (
        "# Rendered by trtllm-pipeline (package stage). Keys are tensorrt_llm.LLM() arguments (TorchLlmArgs),\n"
        "# except triton_config, which the model reads itself. Do not edit: change the build config.\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False)


def config_pbtxt(*, decoupled: bool, instances: int = 1) -> str:
    """tensorrt_llm/config.pbtxt: the Python backend, one CPU-kind instance (the LLM() workers own the GPUs).
    NVIDIA's template leaves max_batch_size and the transaction policy to model.yaml's triton_config, which its
    model.py applies in auto_complete_config; this project's servers run with --disable-auto-complete-config, so
    both are stated here too, with the same values as triton_config."""
    lines = [
        f'name: "{LLM_MODEL}"',
        'backend: "python"',
        "max_batch_size: 0",
        f"model_transaction_policy {{\n  decoupled: {'true' if decoupled else 'false'}\n}}",
        "",
        f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_CPU\n  }}\n]",
        "",
        "input [",
        ",\n".join(
            f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}' + ("\n    optional: true" if optional else "") + "\n  }"
            for name, dtype, dims, optional in LLMAPI_INPUTS
        ),
        "]",
        "output [",
        ",\n".join(f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}\n  }}' for name, dtype, dims in LLMAPI_OUTPUTS),
        "]",
    ]
    return "# Rendered by trtllm-pipeline (package stage). Do not edit.\n" + "\n".join(lines) + "\n"


def serve_options_yaml(options: Mapping[str, Any]) -> str:
    """trtllm-serve's --extra_llm_api_options file: the same options, without `backend` (a flag)."""
    document = {key: value for key, value in options.items() if key != "backend"}
    header = (
        "# Rendered by trtllm-pipeline (package stage): trtllm-serve --extra_llm_api_options. Keys are\n"
        "# tensorrt_llm.LLM() arguments (TorchLlmArgs), the same as the Triton model's model.yaml. Do not edit.\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False)


def serve_command(*, model_path: str, options_file: str, port: int = OPENAI_CONTAINER_PORT, host: str = "0.0.0.0") -> list[str]:
    """The trtllm-serve argv (the OpenAI endpoint is http://<host>:<port>/v1)."""
    return [TRTLLM_SERVE, model_path, "--host", host, "--port", str(port), "--backend", "pytorch", "--extra_llm_api_options", options_file]

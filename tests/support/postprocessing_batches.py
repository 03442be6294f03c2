"""Requests and measurements shared by the tests of batched postprocessing (serve.postprocessing_dynamic_batching):
the ensemble's inputs, a gRPC stream's texts by sequence, a model's statistics and the engine's metrics."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.serving import MODEL_CODE, infer_inputs

PROMPTS = ["def foo(x):\n    return", "import os\n", 'class Foo:\n    """', "for i in range(", "# Copyright", "with open(path) as f:\n"]
MAX_TOKENS = 24


def render_batched_repository(tiny_cpu, repository: Path) -> Path:
    """The tiny cpu model's repository with postprocessing batched, rendered into `repository`."""
    from pipeline.config.spec import ServeSpec
    from pipeline.render import RepositoryRequest, render_model_repository

    # a 5 ms queue delay, so that requests arriving together are batched even on a fast machine
    serve = ServeSpec(postprocessing_dynamic_batching=True, max_queue_delay_microseconds=5000)
    render_model_repository(
        RepositoryRequest(engine_dir=tiny_cpu["engine"], tokenizer_dir=tiny_cpu["tokenizer"], serve=serve, target="cpu", out_dir=repository)
    )
    if "dynamic_batching" not in (repository / "postprocessing" / "config.pbtxt").read_text():
        raise AssertionError("postprocessing was rendered without dynamic_batching")
    return repository


def ensemble_inputs(prompt: str, *, stream: bool, max_tokens: int = MAX_TOKENS, **ints) -> list:
    arrays = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "stream": np.array([[stream]], dtype=np.bool_),
        **{name: np.array([[value]], dtype=np.int32) for name, value in ints.items()},
    }
    return infer_inputs(arrays)


def streamed_texts(url: str, inputs, *, request_id: str | None = None) -> dict[int, list[list[str]]]:
    """Each sequence's responses (sequence_index → the text_output arrays of its responses, in order)."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs, request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True)
        by_sequence: dict[int, list[list[str]]] = {}
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise error
            text = result.as_numpy("text_output")
            if text is not None:
                index = result.as_numpy("sequence_index")
                sequence = int(index.reshape(-1)[0]) if index is not None else 0
                by_sequence.setdefault(sequence, []).append([value.decode("utf-8") for value in text.reshape(-1)])
            if result.get_response().parameters["triton_final_response"].bool_param:
                return by_sequence
    finally:
        client.stop_stream()
        client.close()


def model_stats(http_url: str, model: str) -> tuple[int, int]:
    """(requests, executions) of a model so far."""
    entry = _statistics(http_url, model)
    return int(entry["inference_stats"]["success"]["count"]), int(entry["execution_count"])


def failed_requests(http_url: str, model: str) -> int:
    """The requests of a model answered with an error so far (by the model or, cancelled, by its batcher)."""
    return int(_statistics(http_url, model)["inference_stats"]["fail"]["count"])


def _statistics(http_url: str, model: str) -> dict:
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/stats", timeout=10) as response:
        [entry] = json.loads(response.read())["model_stats"]
    return entry


def reference_beams(tiny_cpu, prompt: str, width: int) -> list[str]:
    """refengine's beams of a prompt, decoded as postprocessing decodes a non-streamed answer."""
    import sys

    from refengine import LLMEngine, SamplingParams

    sys.path.insert(0, str(MODEL_CODE))
    try:
        from hf_tokenizer import HFTokenizer
        from incremental_detokenizer import CONTEXT_TOKENS, text_delta
    finally:
        sys.path.remove(str(MODEL_CODE))
    tokenizer = HFTokenizer(tiny_cpu["tokenizer"])
    prompt_ids = tokenizer.encode(prompt)
    params = SamplingParams(max_tokens=12, temperature=0.0, end_id=tokenizer.eos_id, beam_width=width, n=width)
    [output] = LLMEngine.from_engine_dir(tiny_cpu["engine"]).generate([prompt_ids], params)
    return [text_delta(tokenizer.decode, prompt_ids[-CONTEXT_TOKENS:], list(c.token_ids)) for c in output.outputs]


def engine_idle(metrics_url: str) -> bool:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    used = [line for line in text.splitlines() if line.startswith("nv_trt_llm_kv_cache_block_metrics") and 'kv_cache_block_type="used"' in line]
    active = [line for line in text.splitlines() if line.startswith("nv_trt_llm_request_metrics") and 'request_type="active"' in line]
    return all(line.endswith(" 0") for line in used + active)


def engine_metric(metrics_url: str, family: str, label: str) -> float:
    """The value of one engine metric (the `family` line that carries `label`, e.g. 'token_type="generated"')."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    [value] = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family) and label in line]
    return value


def generated_tokens(metrics_url: str) -> int:
    return int(engine_metric(metrics_url, "trtllm_pipeline_tokens_total", 'token_type="generated"'))


def generated_when_idle(metrics_url: str, timeout_s: float = 60.0) -> int:
    """The engine's generated-token counter once no request runs and two reads 0.3 s apart agree (the model publishes
    every 0.1 s). A cancellation is shown by the tokens its request generated, not by how soon the engine went idle:
    a loaded machine is slow at both, so `timeout_s` is only a hang guard."""
    deadline = time.monotonic() + timeout_s
    while not engine_idle(metrics_url):
        assert time.monotonic() < deadline, f"the engine still generates {timeout_s} s later"
        time.sleep(0.05)
    previous = generated_tokens(metrics_url)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        current = generated_tokens(metrics_url)
        if current == previous and engine_idle(metrics_url):
            return current
        previous = current
    raise AssertionError(f"the generated-token count keeps moving while the engine is idle: {previous}")

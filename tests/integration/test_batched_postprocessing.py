"""serve.postprocessing_dynamic_batching in the real tritonserver (issue #34): postprocessing executions that hold the
responses of different requests at once (streamed and non-streamed, beams, n > 1) give every request its own text,
equal to refengine's; a stream cancelled while its responses wait in batches crashes nothing and misdelivers
nothing. What Triton 2.51 itself does with that cancelled stream (its batcher rejects the stream's next
postprocessing requests, so the generation runs to its end and the ensemble request never ends: core #466) is
checked as the documented limit of the option, not hidden."""

from __future__ import annotations

import concurrent.futures
import json
import queue
import re
import time
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pipeline.config.spec import ServeSpec
from pipeline.render import render_model_repository
from tests.integration.serving import MODEL_CODE, greedy_reference, infer_inputs, loopback_options, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = ["def foo(x):\n    return", "import os\n", 'class Foo:\n    """', "for i in range(", "# Copyright", "with open(path) as f:\n"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def reference(tiny_cpu):
    return greedy_reference(tiny_cpu["engine"], tiny_cpu["tokenizer"], MAX_TOKENS)


@pytest.fixture(scope="module")
def server(tiny_cpu, tmp_path_factory):
    repository = tmp_path_factory.mktemp("batched") / "model_repository"
    # a 5 ms queue delay, so that requests arriving together are batched even on a fast machine
    serve = ServeSpec(postprocessing_dynamic_batching=True, max_queue_delay_microseconds=5000)
    render_model_repository(engine_dir=tiny_cpu["engine"], tokenizer_dir=tiny_cpu["tokenizer"], serve=serve, target="cpu", out_dir=repository)
    assert "dynamic_batching" in (repository / "postprocessing" / "config.pbtxt").read_text()
    with running_server(loopback_options(repository), tmp_path_factory.mktemp("serve"), check_exit=_only_the_cancelled_stream_in_flight) as triton:
        yield triton


def _only_the_cancelled_stream_in_flight(returncode: int, log: str) -> None:
    """The cancelled stream's ensemble request never ends (Triton < r26.03, core #466: the batcher's CANCELLED answer to
    one of its steps while tensorrt_llm still streamed): tritonserver waits for it until its exit timeout and exits 1.
    That, and nothing else: no crash signal, no other model with requests in flight."""
    in_flight = set(re.findall(r"Model '([^']+)' \(version \d+\) has \d+ in-flight inferences", log))
    assert returncode == 0 or (returncode == 1 and in_flight == {"ensemble"}), (returncode, in_flight)
    assert re.search(r"Signal \((?!15\)|2\))\d+\) received", log) is None


def _inputs(prompt: str, *, stream: bool, max_tokens: int = MAX_TOKENS, **ints) -> list:
    arrays = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "stream": np.array([[stream]], dtype=np.bool_),
        **{name: np.array([[value]], dtype=np.int32) for name, value in ints.items()},
    }
    return infer_inputs(arrays)


def _texts(url: str, inputs, *, request_id: str | None = None) -> dict[int, list[list[str]]]:
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


def _stats(http_url: str, model: str) -> tuple[int, int]:
    """(requests, executions) of a model so far."""
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/stats", timeout=10) as response:
        [entry] = json.loads(response.read())["model_stats"]
    return int(entry["inference_stats"]["success"]["count"]), int(entry["execution_count"])


def _beams(tiny_cpu, prompt: str, width: int) -> list[str]:
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


def test_batched_executions_give_every_request_its_own_text(server, reference, tiny_cpu):
    url = server.options.grpc_url
    jobs = (
        [("streamed", prompt, _inputs(prompt, stream=True)) for prompt in PROMPTS[:4]]
        + [("whole", prompt, _inputs(prompt, stream=False)) for prompt in PROMPTS[4:]]
        + [("two samples", PROMPTS[0], _inputs(PROMPTS[0], stream=True, num_return_sequences=2))]
        + [("beams", PROMPTS[1], _inputs(PROMPTS[1], stream=False, max_tokens=12, beam_width=2))]
    )
    requests_before, executions_before = _stats(server.options.http_url, "postprocessing")
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _texts(url, job[2]), jobs))
    for (kind, prompt, _), answer in zip(jobs, answers):
        if kind == "beams":
            assert answer[0] == [_beams(tiny_cpu, prompt, 2)]
            continue
        expected = reference(prompt)
        assert sorted(answer) == ([0, 1] if kind == "two samples" else [0]), kind
        for sequence in answer.values():  # each sequence's deltas, whole characters, make its text
            assert "".join(texts[0] for texts in sequence) == expected, (kind, prompt)
            assert all("\ufffd" not in texts[0] for texts in sequence)
        assert kind != "streamed" or len(answer[0]) > 1
    requests, executions = _stats(server.options.http_url, "postprocessing")
    assert executions - executions_before < requests - requests_before, "postprocessing never held two requests at once"


def _engine_idle(metrics_url: str) -> bool:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    used = [line for line in text.splitlines() if line.startswith("nv_trt_llm_kv_cache_block_metrics") and 'kv_cache_block_type="used"' in line]
    active = [line for line in text.splitlines() if line.startswith("nv_trt_llm_request_metrics") and 'request_type="active"' in line]
    return all(line.endswith(" 0") for line in used + active)


def test_a_stream_cancelled_while_its_responses_wait_in_batches_hurts_no_other(server, reference):
    """Four streams share postprocessing's batches; one is cancelled after a few responses. The others get their own
    texts, whole; the server stays up and ready. Triton 2.51's batcher then answers the cancelled stream's next
    postprocessing requests itself (CANCELLED), so this model never sees them to stop the generation: it runs to its
    end and frees its KV blocks then (the option's documented cost, serve.postprocessing_dynamic_batching)."""
    url = server.options.grpc_url
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("ensemble", _inputs(PROMPTS[0], stream=True, max_tokens=200), request_id=f"cut-{uuid.uuid4().hex}")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        others = [pool.submit(_texts, url, _inputs(prompt, stream=True)) for prompt in PROMPTS[1:4]]
        for _ in range(3):
            result, error = responses.get(timeout=60)
            assert error is None, error
        client.stop_stream(cancel_requests=True)
        client.close()
        for prompt, future in zip(PROMPTS[1:4], others):
            answer = future.result(timeout=120)
            assert list(answer) == [0] and "".join(texts[0] for texts in answer[0]) == reference(prompt)
    assert server.is_running() and server.fatal_signal() is None
    assert _texts(url, _inputs(PROMPTS[4], stream=False))[0] == [[reference(PROMPTS[4])]]
    deadline = time.monotonic() + 60
    while not _engine_idle(server.options.metrics_url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _engine_idle(server.options.metrics_url), "the cancelled generation never ended"

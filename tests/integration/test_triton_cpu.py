"""The rendered cpu-target repository in the real tritonserver (nvidia-pytriton's 2.51 binary).

One server for the module (random free ports on 127.0.0.1), talked to with tritonclient directly:
answers equal refengine's own greedy output, streamed deltas concatenate to the non-streamed
text, concurrent streams get their own texts, bad inputs are refused while the server stays
ready, a cancelled stream frees its KV blocks, /metrics counts (Triton's families and the
engine's: generated tokens, prefix reuse, KV blocks back to idle). The engine-target repository is
loaded too: only tensorrt_llm (no `tensorrtllm` backend here) and what depends on it fail.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pipeline.config.spec import ServeSpec
from pipeline.render import ConfigPaths, RepositoryRequest, render_model_repository
from pipeline.serve import ServerOptions, TritonServer, leaks, read_state, start_detached, stop_detached
from tests.support.serving import SHUTDOWN_TIMEOUT_S, free_ports, infer_inputs, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODEL_CODE = REPO / "model_repo" / "python"
CLI = Path(sys.executable).parent / "trtllm-pipeline"
PROMPTS = [
    "def foo(x):\n    return",
    "import os\n",
    'class Foo:\n    """',
    "for i in range(",
    "# Copyright",
    "with open(path) as f:\n",
    "x = [",
    "if __name__ == ",
    "try:\n    import",
    "def __init__(self",
    "return self.",
    "raise ValueError(",
]
MAX_TOKENS = 24


# -- helpers ----------------------------------------------------------------------------------
def client_inputs(prompt: str, max_tokens: int, *, stream: bool, **extra) -> list[grpcclient.InferInput]:
    """`extra`: name -> (array, Triton datatype), the datatype given explicitly (some tests send a wrong one on purpose)."""
    arrays = {
        "text_input": np.array([[prompt.encode("utf-8")]], dtype=np.object_),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "stream": np.array([[stream]], dtype=np.bool_),
    }
    inputs = infer_inputs(arrays)
    for name, (array, datatype) in extra.items():
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def stream_infer(url: str, model: str, inputs, *, request_id: str | None = None, output: str = "text_output", timeout: float = 60.0):
    """All text deltas of one request over a gRPC stream; raises the request's error."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, request_id=request_id or uuid.uuid4().hex, enable_empty_final_response=True)
        deltas = []
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                raise error
            array = result.as_numpy(output)
            if array is not None:
                deltas.append(array.reshape(-1)[0].decode("utf-8"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return deltas
    finally:
        client.stop_stream()
        client.close()


def http_generate(url: str, model: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/v2/models/{model}/generate", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def metric(values: dict[str, float], family: str, **labels: str) -> float:
    for name, value in values.items():
        if name.startswith(family + "{") and all(f'{key}="{val}"' in name for key, val in labels.items()):
            return value
    raise KeyError(f"{family}{labels} not in /metrics")


def is_ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=5) as response:
            return response.status == 200
    except urllib.error.URLError:
        return False


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def artifacts(tiny_cpu) -> dict[str, Path]:
    """The default config built by the pipeline itself (shared by the session)."""
    return tiny_cpu


@pytest.fixture(scope="module")
def model_code():
    sys.path.insert(0, str(MODEL_CODE))
    yield
    sys.path.remove(str(MODEL_CODE))


@pytest.fixture(scope="module")
def reference(artifacts, model_code):
    """refengine's own greedy text for a prompt, run in this process on the same engine directory."""
    import torch
    from hf_tokenizer import HFTokenizer
    from incremental_detokenizer import CONTEXT_TOKENS, text_delta

    from refengine import LLMEngine, SamplingParams

    torch.set_num_threads(1)  # leave the cores to the server
    tokenizer = HFTokenizer(artifacts["tokenizer"])
    engine = LLMEngine.from_engine_dir(artifacts["engine"])

    @functools.cache
    def greedy_text(prompt: str, max_tokens: int = MAX_TOKENS, stop_words: tuple = (), bad_words: tuple = ()) -> str:
        prompt_ids = tokenizer.encode(prompt)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            end_id=tokenizer.eos_id,
            stop_token_ids=[tokenizer.encode(word, add_special_tokens=False) for word in stop_words],
            bad_words=[tokenizer.encode(word, add_special_tokens=False) for word in bad_words],
        )
        [output] = engine.generate([prompt_ids], params)
        return text_delta(tokenizer.decode, prompt_ids[-CONTEXT_TOKENS:], list(output.outputs[0].token_ids))

    greedy_text.tokenizer = tokenizer
    return greedy_text


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo") / "model_repository"
    render_model_repository(
        RepositoryRequest(engine_dir=artifacts["engine"], tokenizer_dir=artifacts["tokenizer"], serve=ServeSpec(), target="cpu", out_dir=repository)
    )
    _add_variants(repository)
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(
        model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, exit_timeout_secs=SHUTDOWN_TIMEOUT_S
    )
    with running_server(options, tmp_path_factory.mktemp("serve")) as triton:
        yield triton


BLS_VIA_POSTPROCESSING = "tensorrt_llm_bls_via_postprocessing"
BLS_MODELS = ["tensorrt_llm_bls", BLS_VIA_POSTPROCESSING]
LLM_EVERY_THIRD_STEP = "tensorrt_llm_stream_interval_3"


def _add_model_copy(repository: Path, source: str, name: str, parameter: str, value: str | None) -> None:
    """A copy of model `source` named `name`, with its `parameter` set to `value` (None: removed)."""
    import re

    copy = repository / name
    shutil.copytree(repository / source, copy)
    config = (copy / "config.pbtxt").read_text()
    config, renamed = re.subn(rf'^name: "{source}"', f'name: "{name}"', config, flags=re.M)
    block = rf'parameters: \{{\n  key: "{parameter}"\n  value: \{{ string_value: "[^"]*" \}}\n\}}\n'
    replacement = "" if value is None else f'parameters: {{\n  key: "{parameter}"\n  value: {{ string_value: "{value}" }}\n}}\n'
    config, replaced = re.subn(block, replacement, config)
    assert renamed == replaced == 1
    (copy / "config.pbtxt").write_text(config)


def _add_variants(repository: Path) -> None:
    # a second BLS without `tokenizer_dir`: it asks postprocessing for every delta, as NVIDIA's BLS does
    _add_model_copy(repository, "tensorrt_llm_bls", BLS_VIA_POSTPROCESSING, "tokenizer_dir", None)
    # a second LLM model that streams a response every third decoding step (serve.stream_interval 3)
    _add_model_copy(repository, "tensorrt_llm", LLM_EVERY_THIRD_STEP, "stream_interval", "3")


# -- answers ----------------------------------------------------------------------------------
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp and tcp6


def test_server_listens_on_loopback_only(server):
    listening: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                address, port = fields[1].split(":")
                listening.setdefault(int(port, 16), set()).add(address)
    for port in (server.options.http_port, server.options.grpc_port, server.options.metrics_port):
        assert listening.get(port), f"nothing listens on port {port}"
        assert listening[port] <= LOOPBACK, f"port {port} is bound to {listening[port]}, not only to 127.0.0.1"


def test_http_generate_matches_refengine_greedy_output(server, reference):
    for prompt in PROMPTS[:3]:
        status, body = http_generate(server.options.http_url, "ensemble", {"text_input": prompt, "max_tokens": MAX_TOKENS})
        assert status == 200, body
        assert body["text_output"] == reference(prompt)


def test_grpc_non_streamed_answer_matches_and_unary_infer_names_the_decoupled_policy(server, reference):
    prompt = PROMPTS[0]
    deltas = stream_infer(server.options.grpc_url, "ensemble", client_inputs(prompt, MAX_TOKENS, stream=False))
    assert deltas == [reference(prompt)]
    # Unary ModelInfer cannot reach a decoupled model (the ensemble is decoupled because tensorrt_llm is).
    with grpcclient.InferenceServerClient(server.options.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
            client.infer("ensemble", client_inputs(prompt, MAX_TOKENS, stream=False))


@pytest.mark.parametrize("model", ["ensemble", *BLS_MODELS])
def test_streamed_deltas_concatenate_to_the_non_streamed_text(server, reference, model):
    for prompt in PROMPTS[:3]:
        streamed = stream_infer(server.options.grpc_url, model, client_inputs(prompt, MAX_TOKENS, stream=True))
        whole = stream_infer(server.options.grpc_url, model, client_inputs(prompt, MAX_TOKENS, stream=False))
        assert len(streamed) > 1
        assert "".join(streamed) == "".join(whole) == reference(prompt)
        assert all("\ufffd" not in delta for delta in streamed)


def _responses(url: str, model: str, inputs, names: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    """The named outputs of each response of one request that carries any (gRPC stream)."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
        found: list[dict[str, np.ndarray]] = []
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise error
            if arrays := {name: result.as_numpy(name) for name in names if result.as_numpy(name) is not None}:
                found.append(arrays)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return found
    finally:
        client.stop_stream()
        client.close()


def _final_arrays(url: str, model: str, inputs, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The named outputs of a request's last response that carries them (gRPC stream)."""
    found: dict[str, np.ndarray] = {}
    for arrays in _responses(url, model, inputs, names):
        found.update(arrays)
    return found


@pytest.mark.parametrize("stop_words", [(), ("\n",)], ids=["", "stop-words"])
@pytest.mark.parametrize("model", ["ensemble", *BLS_MODELS])
def test_beam_search_returns_every_beam_as_refengine_computes_them(server, reference, artifacts, model, stop_words):
    """The served spec builds max_beam_width 4: one answer with 4 texts, best first, equal to
    refengine's beams decoded the way postprocessing decodes them, with each beam's cum_log_probs;
    with a stop word, each beam that produces it ends there (and keeps it)."""
    from incremental_detokenizer import CONTEXT_TOKENS, text_delta

    from refengine import LLMEngine, SamplingParams

    tokenizer, prompt = reference.tokenizer, PROMPTS[0]
    prompt_ids = tokenizer.encode(prompt)
    engine = LLMEngine.from_engine_dir(artifacts["engine"])
    stops = [tokenizer.encode(word, add_special_tokens=False) for word in stop_words]
    params = SamplingParams(max_tokens=12, temperature=0.0, end_id=tokenizer.eos_id, beam_width=4, n=4, stop_token_ids=stops)
    [expected] = engine.generate([prompt_ids], params)
    words = {"stop_words": _words(*stop_words)} if stop_words else {}
    inputs = client_inputs(
        prompt,
        12,
        stream=False,
        beam_width=(np.array([[4]], dtype=np.int32), "INT32"),
        return_log_probs=(np.array([[True]]), "BOOL"),
        **words,
    )
    got = _final_arrays(server.options.grpc_url, model, inputs, ("text_output", "cum_log_probs"))
    texts = [value.decode("utf-8") for value in got["text_output"].reshape(-1)]
    assert texts == [text_delta(tokenizer.decode, prompt_ids[-CONTEXT_TOKENS:], list(c.token_ids)) for c in expected.outputs]
    assert len(set(texts)) > 1
    assert not stop_words or any(c.finish_reason == "stop" and text.endswith("\n") for c, text in zip(expected.outputs, texts))
    assert got["cum_log_probs"].reshape(-1).tolist() == pytest.approx([c.cum_log_prob for c in expected.outputs], abs=1e-4)


@pytest.mark.parametrize("model", ["ensemble", *BLS_MODELS])
def test_streamed_beams_come_whole_each_step_as_refengine_streams_them(server, reference, artifacts, model):
    """Streamed beam search, as TensorRT-LLM streams it: one response per step with every returned beam
    whole (best first, the prompt left out), equal step by step to refengine's stream, then its final beams."""
    from incremental_detokenizer import CONTEXT_TOKENS, text_delta

    from refengine import LLMEngine, SamplingParams

    tokenizer, prompt = reference.tokenizer, PROMPTS[0]
    prompt_ids = tokenizer.encode(prompt)
    engine = LLMEngine.from_engine_dir(artifacts["engine"])
    params = SamplingParams(max_tokens=10, temperature=0.0, end_id=tokenizer.eos_id, beam_width=3, n=2, logprobs=0)
    expected = list(engine.stream(prompt_ids, params))
    inputs = client_inputs(
        prompt,
        10,
        stream=True,
        beam_width=(np.array([[3]], dtype=np.int32), "INT32"),
        num_return_sequences=(np.array([[2]], dtype=np.int32), "INT32"),
        return_log_probs=(np.array([[True]]), "BOOL"),
    )
    got = _responses(server.options.grpc_url, model, inputs, ("text_output", "cum_log_probs"))
    assert len(got) == len(expected) > 2
    for response, output in zip(got, expected):
        texts = [value.decode("utf-8") for value in response["text_output"].reshape(-1)]
        assert texts == [text_delta(tokenizer.decode, prompt_ids[-CONTEXT_TOKENS:], list(c.token_ids)) for c in output.outputs]
        assert response["cum_log_probs"].reshape(-1).tolist() == pytest.approx([c.cum_log_prob for c in output.outputs], abs=1e-4)


def test_postprocessing_streams_multibyte_characters_whole(server, reference):
    """The tiny model writes ASCII Python; so drive postprocessing with tokens that split characters."""
    tokenizer = reference.tokenizer
    text = " héllo 你好 🎉 wörld"
    prompt_ids = tokenizer.encode("# note:")
    ids = tokenizer.encode(text, add_special_tokens=False)
    client = grpcclient.InferenceServerClient(server.options.grpc_url)
    history, deltas = list(prompt_ids), []  # the client is closed below
    for token_id in ids:
        arrays = {
            "TOKENS_BATCH": np.array([[[token_id]]], dtype=np.int32),
            "SEQUENCE_LENGTH": np.array([[1]], dtype=np.int32),
            "PRECEDING_IDS": np.array([[history[-8:]]], dtype=np.int32),
        }
        result = client.infer("postprocessing", infer_inputs(arrays))
        deltas.append(result.as_numpy("OUTPUT").reshape(-1)[0].decode("utf-8"))
        history.append(token_id)
    client.close()
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
    assert deltas[0].startswith(" ")


def test_concurrent_streaming_clients_each_get_their_own_text(server, reference):
    expected = {prompt: reference(prompt) for prompt in PROMPTS}
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def run(prompt: str) -> None:
        try:
            results[prompt] = "".join(stream_infer(server.options.grpc_url, "ensemble", client_inputs(prompt, MAX_TOKENS, stream=True)))
        except BaseException as error:  # collected and re-raised in the test thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(prompt,)) for prompt in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert results == expected


def _settled_metrics(url: str) -> dict[str, float]:
    """/metrics once two reads agree (an ensemble counts its request just after the last response)."""
    previous = metrics(url)
    for _ in range(50):
        time.sleep(0.1)
        current = metrics(url)
        if all(current.get(k) == v for k, v in previous.items() if k.startswith("nv_inference_request_success")):
            return current
        previous = current
    return previous


def test_metrics_count_the_requests(server):
    models = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")
    before = _settled_metrics(server.options.metrics_url)
    for _ in range(3):
        stream_infer(server.options.grpc_url, "ensemble", client_inputs(PROMPTS[1], 4, stream=False))

    def counted(model):
        after = metrics(server.options.metrics_url)
        return metric(after, "nv_inference_request_success", model=model) - metric(before, "nv_inference_request_success", model=model)

    assert _wait_for(lambda: all(counted(model) == 3 for model in models), 30.0), {model: counted(model) for model in models}
    after = metrics(server.options.metrics_url)
    assert metric(after, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max") == 1024
    assert metric(after, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per") == 32


def _words(*words: str) -> tuple[np.ndarray, str]:
    return np.array([[word.encode("utf-8") for word in words]], dtype=np.object_), "BYTES"


def test_stop_and_bad_words_reach_the_engine(server, reference):
    prompt = "import os\n"
    plain = reference(prompt)
    stopped = reference(prompt, stop_words=("\n",))
    banned = reference(prompt, bad_words=(" sys",))
    assert len({plain, stopped, banned}) == 3, "the words must change this prompt's output"
    for model in ("ensemble", "tensorrt_llm_bls"):
        url = server.options.grpc_url
        assert "".join(stream_infer(url, model, client_inputs(prompt, MAX_TOKENS, stream=False, stop_words=_words("\n")))) == stopped
        assert "".join(stream_infer(url, model, client_inputs(prompt, MAX_TOKENS, stream=True, bad_words=_words(" sys")))) == banned


def test_exclude_input_in_output_and_seeded_sampling(server, reference):
    prompt = PROMPTS[2]
    keep_input = {"exclude_input_in_output": (np.array([[False]], dtype=np.bool_), "BOOL")}
    [with_prompt] = stream_infer(server.options.grpc_url, "ensemble", client_inputs(prompt, MAX_TOKENS, stream=False, **keep_input))
    assert with_prompt == prompt + reference(prompt)
    sampling = {
        "temperature": (np.array([[1.0]], dtype=np.float32), "FP32"),
        "top_k": (np.array([[40]], dtype=np.int32), "INT32"),
        "seed": (np.array([[1234]], dtype=np.uint64), "UINT64"),
    }
    first = stream_infer(server.options.grpc_url, "ensemble", client_inputs(prompt, MAX_TOKENS, stream=False, **sampling))
    second = stream_infer(server.options.grpc_url, "ensemble", client_inputs(prompt, MAX_TOKENS, stream=False, **sampling))
    assert first == second


# -- bad inputs -------------------------------------------------------------------------------
def _grpc_error(server, inputs, model="ensemble") -> str:
    with pytest.raises(InferenceServerException) as raised:
        stream_infer(server.options.grpc_url, model, inputs)
    return str(raised.value)


BAD_REQUESTS = {
    "max_tokens zero": ({"text_input": "x", "max_tokens": 0}, 400, "max_tokens must be at least 1, got 0"),
    "max_tokens negative": ({"text_input": "x", "max_tokens": -5}, 400, "max_tokens must be at least 1, got -5"),
    "max_tokens huge": ({"text_input": "x", "max_tokens": 1_000_000}, 400, "max_tokens 1000000 is more than the engine can generate"),
    # 2**31 reaches the model wrapped to INT32 by Triton's JSON conversion, and is refused as such.
    "max_tokens 2**31": ({"text_input": "x", "max_tokens": 2**31}, 400, "max_tokens must be at least 1, got -2147483648"),
    "max_tokens two values": ({"text_input": "x", "max_tokens": [4, 5]}, 400, "batch size does not match other inputs"),
    "prompt not UTF-8": ({"text_input": "ab\udcff", "max_tokens": 4}, 400, "input 'text_input' is not valid UTF-8"),
    "unknown input, a list": ({"text_input": "x", "max_tokens": 4, "foo": [1]}, 400, "parameter 'foo' has invalid type"),
    "prompt too long": ({"text_input": "x " * 2000, "max_tokens": 4}, 400, "more than the engine's max_input_len 768"),
    "missing text_input": ({"max_tokens": 4}, 400, "input 'text_input' is required"),
    "missing max_tokens": ({"text_input": "x"}, 400, "input 'max_tokens' is required"),
    "unknown input": ({"text_input": "x", "max_tokens": 4, "no_such_input": 1}, 400, "unknown input or parameter 'no_such_input'"),
    # Refused by their byte length, before tokenizing (the tokenizer's longest token is 45 bytes).
    "prompt over the byte bound": (
        {"text_input": "x" * 40_000, "max_tokens": 4},
        400,
        "text_input is 40000 bytes, more than the engine's max_input_len 768 tokens can hold (at most 34560 bytes); it was not tokenized",
    ),
    "stop word over the byte bound": (
        {"text_input": "x", "max_tokens": 4, "stop_words": ["y" * 50_000]},
        400,
        "stop_words is 50000 bytes, longer than any sequence",
    ),
    # TensorRT-LLM's SamplingConfig: temperature >= 0 (also when greedy decoding ignores it); the
    # project also refuses a non-finite one and one above 100.
    "temperature negative": ({"text_input": "x", "max_tokens": 4, "temperature": -1.0}, 400, "temperature: must be between 0 and 100, got -1.0"),
    "temperature NaN": ({"text_input": "x", "max_tokens": 4, "temperature": float("nan")}, 400, "temperature: must be a finite number, got nan"),
    "temperature 1e30": ({"text_input": "x", "max_tokens": 4, "temperature": 1e30, "top_k": 5}, 400, "temperature: must be between 0 and 100"),
    "pad_id outside the vocabulary": (
        {"text_input": "x", "max_tokens": 4, "pad_id": 99_999},
        400,
        "pad_id: token id 99999 is outside the vocabulary [0, 4096)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_http_requests_get_a_4xx_and_the_server_stays_ready(server, case):
    body, status, message = BAD_REQUESTS[case]
    code, answer = http_generate(server.options.http_url, "ensemble", body)
    assert code == status, answer
    assert message in answer.get("error", ""), answer
    assert is_ready(server.options.http_url)


# What Triton's own JSON-to-tensor conversion of /generate does before any model runs (http_server.cc,
# ExactMappingInput → ReadDataFromJson): a JSON value of the wrong type for a declared input is a
# TritonJson accessor error, which http_server.cc creates as TRITONSERVER_ERROR_INTERNAL, and
# HttpCodeFromError maps INTERNAL to 500. No datatype or model-config option changes that (BYTES
# inputs refuse JSON numbers the same way). INT32 values are cast without a range check.
HTTP_500_FROM_TRITON = {
    "max_tokens not a number": (b'{"text_input": "x", "max_tokens": "ten"}', "attempt to access JSON non-signed-integer as signed-integer"),
    "max_tokens a float": (b'{"text_input": "x", "max_tokens": 4.5}', "attempt to access JSON non-signed-integer as signed-integer"),
    "temperature not a number": (b'{"text_input": "x", "max_tokens": 4, "temperature": "hot"}', "attempt to access JSON non-number as double"),
    "text_input a number": (b'{"text_input": 5, "max_tokens": 4}', "attempt to access JSON non-string as string"),
    "stream not a boolean": (b'{"text_input": "x", "max_tokens": 4, "stream": "yes"}', "attempt to access JSON non-boolean as boolean"),
    "seed negative": (b'{"text_input": "x", "max_tokens": 4, "seed": -1}', "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    "body not JSON": (b'{"text_input": ', "failed to parse the request JSON buffer"),
}


def test_huge_prompts_are_refused_untokenized_while_other_requests_are_served(server, reference):
    """Three concurrent 10 MB prompts (gRPC: Triton 2.51's HTTP front end itself dies on /generate
    bodies over ~4 MB, see docs/serving.md) are each refused by their byte length, never tokenized, and
    a small request made meanwhile over HTTP gets its usual answer."""
    huge = "def f(x):\n    return x\n" * 420_000

    def refusal() -> str:
        with pytest.raises(InferenceServerException) as raised:
            stream_infer(server.options.grpc_url, "ensemble", client_inputs(huge, 4, stream=False), timeout=120)
        return str(raised.value)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        refusals = [pool.submit(refusal) for _ in range(3)]
        small = pool.submit(http_generate, server.options.http_url, "ensemble", {"text_input": PROMPTS[1], "max_tokens": 4})
        for future in refusals:
            message = future.result(timeout=120)
            assert "text_input is 9660000 bytes, more than the engine's max_input_len 768 tokens can hold" in message, message
            assert "it was not tokenized" in message
        status, answer = small.result(timeout=120)
    assert status == 200 and answer["text_output"] == reference(PROMPTS[1], max_tokens=4)
    assert is_ready(server.options.http_url)


def test_http_values_of_the_wrong_json_type_get_triton_s_own_500_and_the_server_stays_ready(server, reference):
    """Documented in docs/serving.md; the clients library refuses these values before sending them."""
    url = f"{server.options.http_url}/v2/models/ensemble/generate"
    for case, (body, message) in HTTP_500_FROM_TRITON.items():
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=60)
        answer = json.loads(raised.value.read())
        assert raised.value.code == 500 and message in answer["error"], (case, answer)
        assert is_ready(server.options.http_url)
    # 2**32 + 5 arrives as 5 (INT32 cast): the same answer as max_tokens 5.
    status, wrapped = http_generate(server.options.http_url, "ensemble", {"text_input": PROMPTS[1], "max_tokens": 2**32 + 5})
    assert status == 200 and wrapped["text_output"] == reference(PROMPTS[1], max_tokens=5)


def test_bad_grpc_requests_name_the_problem_and_the_server_stays_ready(server):
    url = server.options.grpc_url
    assert "max_tokens must be at least 1" in _grpc_error(server, client_inputs("x", 0, stream=True))
    assert "more than the engine's max_input_len 768" in _grpc_error(server, client_inputs("x " * 2000, 4, stream=False))
    wrong_type = client_inputs("x", 4, stream=False)[:1] + [grpcclient.InferInput("max_tokens", [1, 1], "FP32")]
    wrong_type[1].set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    assert "max_tokens" in _grpc_error(server, wrong_type) and "INT32" in _grpc_error(server, wrong_type)
    missing = client_inputs("x", 4, stream=False)[1:]  # max_tokens and stream, no text_input
    assert "input 'text_input' is required" in _grpc_error(server, missing)
    assert "input 'text_input' is required" in _grpc_error(server, missing, model="tensorrt_llm_bls")
    unknown = client_inputs("x", 4, stream=False) + [grpcclient.InferInput("no_such_input", [1, 1], "INT32")]
    unknown[-1].set_data_from_numpy(np.array([[1]], dtype=np.int32))
    assert "no_such_input" in _grpc_error(server, unknown)
    assert "beam_width: 8 exceeds the engine's max_beam_width 4" in _grpc_error(
        server, client_inputs("x", 4, stream=False, beam_width=(np.array([[8]], dtype=np.int32), "INT32"))
    )
    assert "max_tokens must be at least 1" in _grpc_error(server, client_inputs("x", 0, stream=True), model="tensorrt_llm_bls")
    drafted = client_inputs("x", 4, stream=False, num_draft_tokens=(np.array([[4]], dtype=np.int32), "INT32"))
    assert "num_draft_tokens: the engine was built without draft-target speculative decoding" in _grpc_error(server, drafted, model="tensorrt_llm_bls")
    by_logits = client_inputs("x", 4, stream=False, use_draft_logits=(np.array([[True]], dtype=np.bool_), "BOOL"))
    assert "use_draft_logits: true needs draft-target speculative decoding" in _grpc_error(server, by_logits, model="tensorrt_llm_bls")
    not_utf8 = client_inputs("x", 4, stream=False)
    not_utf8[0].set_data_from_numpy(np.array([[b"ab\xff\xfe"]], dtype=np.object_))
    assert "input 'text_input' is not valid UTF-8 (invalid start byte at byte 2)" in _grpc_error(server, not_utf8)
    wrong_shape = client_inputs("x", 4, stream=False)[:1] + [grpcclient.InferInput("max_tokens", [1, 2], "INT32")]
    wrong_shape[1].set_data_from_numpy(np.array([[4, 5]], dtype=np.int32))
    assert "unexpected shape for input 'max_tokens' for model 'ensemble'. Expected [-1,1], got [1,2]" in _grpc_error(server, wrong_shape)
    assert is_ready(server.options.http_url)
    assert stream_infer(url, "ensemble", client_inputs(PROMPTS[0], 4, stream=False))


def test_streaming_over_plain_http_infer_is_refused_clearly(server):
    client = httpclient.InferenceServerClient(server.options.http_url.removeprefix("http://"))
    inputs = []
    for name, array, datatype in (
        ("text_input", np.array([[b"x"]], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([[4]], dtype=np.int32), "INT32"),
        ("stream", np.array([[True]], dtype=np.bool_), "BOOL"),
    ):
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("ensemble", inputs)
    finally:
        client.close()  # an open keep-alive connection would hold up the server's shutdown
    # Triton answers 501 (its UNSUPPORTED error code) for any /infer on a decoupled model, before any
    # model runs; streams go over gRPC or /generate_stream. Documented in docs/serving.md.
    assert raised.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(raised.value)
    assert is_ready(server.options.http_url)


# -- cancellation -----------------------------------------------------------------------------
def _kv_blocks_used(server) -> float:
    return metric(metrics(server.options.metrics_url), "nv_trt_llm_kv_cache_block_metrics", model="tensorrt_llm", kv_cache_block_type="used")


def _active_requests(server) -> float:
    return metric(metrics(server.options.metrics_url), "nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="active")


def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize(
    "model, beam_width",
    [("ensemble", 1), ("tensorrt_llm_bls", 1), ("tensorrt_llm", 1), ("ensemble", 3), ("tensorrt_llm", 3)],
    ids=["ensemble", "tensorrt_llm_bls", "tensorrt_llm", "ensemble-beams", "tensorrt_llm-beams"],
)
def test_a_cancelled_stream_frees_its_kv_blocks(server, reference, model, beam_width):
    """Also with streamed beams. Not by time alone: 600 greedy tokens stream in ~3.5 s on a fast machine, so
    the generated-token counter must show that the request stopped early (a beam request counts its
    tokens when its search ends, so a cancelled one adds none)."""
    before = _idle_engine_figures(server)
    beams = {"beam_width": np.array([[beam_width]], dtype=np.int32)} if beam_width > 1 else {}
    if model == "tensorrt_llm":
        prompt_ids = reference.tokenizer.encode(PROMPTS[0])
        inputs = infer_inputs(
            {
                "input_ids": np.array([prompt_ids], dtype=np.int32),
                "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
                "request_output_len": np.array([[600]], dtype=np.int32),
                "streaming": np.array([[True]], dtype=np.bool_),
                **beams,
            }
        )
    else:
        inputs = client_inputs(PROMPTS[0], 600, stream=True, **{name: (array, "INT32") for name, array in beams.items()})
    client = grpcclient.InferenceServerClient(server.options.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(model, inputs, request_id=f"cancel-{uuid.uuid4().hex}")
    for _ in range(3):  # generation is under way
        result, error = responses.get(timeout=30)
        assert error is None, error
    assert _wait_for(lambda: _kv_blocks_used(server) > 0 and _active_requests(server) > 0, 30.0), "the generation never showed"
    cancelled_at = time.monotonic()
    client.stop_stream(cancel_requests=True)
    client.close()
    # Freed after the cancellation (a hang guard: how soon is the machine's load); the generated-token count below
    # shows the request did not just end.
    assert _wait_for(lambda: _kv_blocks_used(server) == 0 and _active_requests(server) == 0, 60.0), (
        f"KV blocks still used {time.monotonic() - cancelled_at:.1f} s after the cancellation"
    )
    generated = _moved(before, _idle_engine_figures(server))["generated"]
    assert generated < 600, f"the cancelled request ran to its end ({generated} tokens generated)"
    assert stream_infer(server.options.grpc_url, "ensemble", client_inputs(PROMPTS[1], 4, stream=False))


# -- engine metrics ---------------------------------------------------------------------------
def _llm_output_ids(server, prompt_ids: list[int], output_len: int) -> list[int]:
    """The tokens of one streamed request to the `tensorrt_llm` model itself. Without `end_id`
    nothing ends it early: exactly `output_len` tokens."""
    return [token for response in _llm_streamed_responses(server, prompt_ids, output_len) for token in response]


def _llm_streamed_responses(server, prompt_ids: list[int], output_len: int, model: str = "tensorrt_llm", **extra: np.ndarray) -> list[list[int]]:
    """The output_ids of each response of one streamed request to an LLM model itself (the final empty one left out);
    `extra`: more input arrays."""
    arrays = {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=np.bool_),
        **extra,
    }
    client = grpcclient.InferenceServerClient(server.options.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, infer_inputs(arrays), request_id=uuid.uuid4().hex, enable_empty_final_response=True)
        tokens: list[list[int]] = []
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                raise error
            ids = result.as_numpy("output_ids")
            if ids is not None:
                tokens.append(ids.reshape(-1).tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return tokens
    finally:
        client.stop_stream()
        client.close()


def test_stream_interval_sends_every_third_steps_tokens_together(server, reference):
    prompt_ids = reference.tokenizer.encode(PROMPTS[0])
    every_token = _llm_streamed_responses(server, prompt_ids, 10)
    every_third = _llm_streamed_responses(server, prompt_ids, 10, model=LLM_EVERY_THIRD_STEP)
    assert [len(ids) for ids in every_token] == [1] * 10
    # the first decoding step, steps 3, 6, 9, then the last (TensorRT-LLM's stream_interval)
    assert [len(ids) for ids in every_third] == [1, 2, 3, 3, 1]
    assert sum(every_third, []) == sum(every_token, [])


def test_the_cpu_model_takes_a_priority_and_refuses_one_outside_0_to_1(server, reference):
    prompt_ids = reference.tokenizer.encode(PROMPTS[0])
    default = _llm_streamed_responses(server, prompt_ids, 4)
    assert _llm_streamed_responses(server, prompt_ids, 4, priority=np.array([[0.9]], dtype=np.float32)) == default
    with pytest.raises(InferenceServerException, match="priority"):
        _llm_streamed_responses(server, prompt_ids, 4, priority=np.array([[1.5]], dtype=np.float32))


ENGINE_SERIES = {
    "generated": ("trtllm_pipeline_tokens_total", {"token_type": "generated"}),
    "prompt_computed": ("trtllm_pipeline_tokens_total", {"token_type": "prompt_computed"}),
    "prompt_reused": ("trtllm_pipeline_tokens_total", {"token_type": "prompt_reused"}),
    "prefix_hits": ("trtllm_pipeline_prefix_cache_hits_total", {}),
    "preemptions": ("trtllm_pipeline_preemptions_total", {}),
    "iterations": ("nv_trt_llm_general_metrics", {"general_type": "iteration_counter"}),
    "reused_blocks": ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "reused"}),
    "kv_used": ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "used"}),
    "kv_fraction": ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
    "active": ("nv_trt_llm_request_metrics", {"request_type": "active"}),
}


def _engine_figures(server) -> dict[str, float]:
    values = metrics(server.options.metrics_url)
    return {key: metric(values, family, model="tensorrt_llm", **labels) for key, (family, labels) in ENGINE_SERIES.items()}


def _idle_engine_figures(server) -> dict[str, float]:
    """The figures once nothing runs and two reads 0.3 s apart agree (the model publishes every 0.1 s)."""
    assert _wait_for(lambda: _kv_blocks_used(server) == 0 and _active_requests(server) == 0, 10), "engine not idle"
    previous = _engine_figures(server)
    for _ in range(50):
        time.sleep(0.3)
        current = _engine_figures(server)
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"engine figures keep moving while idle: {previous}")


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in ("generated", "prompt_computed", "prompt_reused", "prefix_hits", "preemptions", "reused_blocks")}


def test_engine_metrics_are_published_with_their_kinds(server):
    with urllib.request.urlopen(server.options.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in ("trtllm_pipeline_tokens_total", "trtllm_pipeline_prefix_cache_hits_total", "trtllm_pipeline_preemptions_total"):
        assert f"# TYPE {family} counter" in text
    for family in ("nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics", "nv_trt_llm_general_metrics"):
        assert f"# TYPE {family} gauge" in text


def test_engine_metrics_count_generated_tokens_and_prefix_reuse(server, reference):
    """A greedy request with a known output length adds exactly that many generated tokens; the same
    long prompt sent again reuses its full KV blocks (one prefix-cache hit); the KV cache returns to idle."""
    tokens_per_block = 32  # build_configs/tiny-cpu.yaml
    text = f"# {uuid.uuid4().hex}\n" + "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(12))
    prompt_ids = reference.tokenizer.encode(text)  # unique from its first block on: nothing cached yet
    assert len(prompt_ids) > 2 * tokens_per_block
    reusable = (len(prompt_ids) - 1) // tokens_per_block * tokens_per_block  # the last token is always computed
    start = _idle_engine_figures(server)

    assert len(_llm_output_ids(server, prompt_ids, 8)) == 8
    first = _idle_engine_figures(server)
    assert _moved(start, first) == {
        "generated": 8, "prompt_computed": len(prompt_ids), "prompt_reused": 0, "prefix_hits": 0, "preemptions": 0, "reused_blocks": 0,
    }  # fmt: skip
    assert first["iterations"] - start["iterations"] >= 8  # a prefill, then one decode per further token

    assert len(_llm_output_ids(server, prompt_ids, 5)) == 5
    second = _idle_engine_figures(server)
    assert _moved(first, second) == {
        "generated": 5,
        "prompt_computed": len(prompt_ids) - reusable,
        "prompt_reused": reusable,
        "prefix_hits": 1,
        "preemptions": 0,  # guaranteed_no_evict never preempts
        "reused_blocks": reusable // tokens_per_block,
    }
    assert second["kv_used"] == 0 and second["kv_fraction"] == 0 and second["active"] == 0


# -- the engine target's repository -----------------------------------------------------------
def llama_31_8b_engine(directory: Path, **build_config) -> Path:
    """A fabricated engine directory shaped like trtllm-build 1.2's output for Llama-3.1-8B FP8 (`build_config`: extra or
    replaced build_config keys; a `plugin_config` entry is merged into the plugin config)."""
    directory.mkdir(parents=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "logits_dtype": "float32",
            "vocab_size": 128256,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
        },
        "build_config": {
            "max_batch_size": 256,
            "max_input_len": 8192,
            "max_seq_len": 16384,
            "max_num_tokens": 8192,
            "max_beam_width": 1,
            "kv_cache_type": "PAGED",
            "gather_context_logits": False,
            "gather_generation_logits": False,
            "plugin_config": {
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "use_paged_context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "tokens_per_block": 32,
            },
        },
    }
    config["build_config"]["plugin_config"].update(build_config.pop("plugin_config", {}))
    config["build_config"].update(build_config)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "rank0.engine").write_bytes(b"")
    return directory


def _lenient_options(repository: Path) -> ServerOptions:
    """A server on fresh ports that starts with models failing to load (the engine target's missing backend)."""
    http_port, grpc_port, metrics_port = free_ports(3)
    return ServerOptions(
        model_repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        exit_timeout_secs=5,
        exit_on_error=False,
        strict_readiness=False,
    )


def _states_and_bls_metadata(repository: Path) -> tuple[dict, dict]:
    """Every model's load state, and the loaded BLS's metadata, from one lenient server run."""
    options = _lenient_options(repository)
    server = TritonServer(options).start()
    try:
        states = server.wait_until_ready(timeout=60, require_all_ready=False)
        bls = httpclient.InferenceServerClient(f"127.0.0.1:{options.http_port}").get_model_metadata("tensorrt_llm_bls")
    finally:
        server.stop()
    return states, bls


def test_engine_target_repository_fails_only_for_the_missing_tensorrtllm_backend(artifacts, tmp_path):
    repository = tmp_path / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=llama_31_8b_engine(tmp_path / "engine"),
            tokenizer_dir=artifacts["tokenizer"],
            serve=ServeSpec(),
            target="engine",
            out_dir=repository,
            config_paths=ConfigPaths(str(tmp_path / "engine"), str(artifacts["tokenizer"])),
        )
    )
    options = _lenient_options(repository)
    state_dir = tmp_path / "serve-state"
    with pytest.raises(Exception, match="models not ready: .*tensorrt_llm: UNAVAILABLE"):
        start_detached(options, state_dir, timeout=60)  # the strict form refuses, naming the model
    assert read_state(state_dir) is None

    server = TritonServer(options).start()
    try:
        states = server.wait_until_ready(timeout=60, require_all_ready=False)
    finally:
        server.stop()
    assert states["tensorrt_llm"].state == "UNAVAILABLE"
    assert "unable to find backend library for backend 'tensorrtllm'" in states["tensorrt_llm"].reason
    assert states["preprocessing"].ready and states["postprocessing"].ready and states["tensorrt_llm_bls"].ready
    # The ensemble is not loaded without its tensorrt_llm step; nothing else fails.
    assert not states["ensemble"].ready
    assert set(states) == {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}


def test_lora_and_lookahead_repository_loads_up_to_the_missing_backend(artifacts, tmp_path):
    """The LoRA inputs (lora_weights typed TYPE_BF16 like the plugin) and lookahead parameters are valid Triton config."""
    from pipeline.config.spec import ServeLoraSpec, SpeculativeSpec

    engine = llama_31_8b_engine(
        tmp_path / "engine",
        plugin_config={"lora_plugin": "bfloat16"},
        speculative_decoding_mode=8,
        max_draft_len=15,
        max_seq_len=16384 + 15,
        lora_config={"lora_dir": ["lora/0"], "lora_ckpt_source": "hf", "max_lora_rank": 32, "lora_target_modules": ["attn_q", "attn_v"]},
    )
    repository = tmp_path / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine,
            tokenizer_dir=artifacts["tokenizer"],
            serve=ServeSpec(lora=ServeLoraSpec(cache_optimal_adapter_size=16)),
            target="engine",
            out_dir=repository,
            speculative=SpeculativeSpec(mode="lookahead_decoding"),
        )
    )
    states, bls = _states_and_bls_metadata(repository)
    assert "unable to find backend library for backend 'tensorrtllm'" in states["tensorrt_llm"].reason
    assert states["preprocessing"].ready and states["postprocessing"].ready and states["tensorrt_llm_bls"].ready
    inputs = {tensor["name"]: tensor["datatype"] for tensor in bls["inputs"]}
    assert (inputs["lora_task_id"], inputs["lora_weights"], inputs["lora_config"]) == ("UINT64", "BF16", "INT32")


def test_draft_target_repository_loads_up_to_the_missing_backend(artifacts, tmp_path):
    """Two tensorrtllm models (target and draft) and a BLS wired to the draft are valid Triton config; the BLS loads."""
    from pipeline.config.spec import SpeculativeSpec

    engine = llama_31_8b_engine(tmp_path / "engine", speculative_decoding_mode=2, max_draft_len=4, max_seq_len=16384 + 4)
    draft = llama_31_8b_engine(tmp_path / "draft", max_seq_len=16384 + 4)
    repository = tmp_path / "model_repository"
    speculative = SpeculativeSpec(mode="draft_tokens_external", max_draft_len=4, draft={"source": str(tmp_path / "unused")})
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine,
            tokenizer_dir=artifacts["tokenizer"],
            serve=ServeSpec(),
            target="engine",
            out_dir=repository,
            speculative=speculative,
            draft_engine_dir=draft,
        )
    )
    states, bls = _states_and_bls_metadata(repository)
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        assert "unable to find backend library for backend 'tensorrtllm'" in states[name].reason
    assert states["preprocessing"].ready and states["postprocessing"].ready and states["tensorrt_llm_bls"].ready
    assert {"num_draft_tokens", "use_draft_logits"} <= {tensor["name"] for tensor in bls["inputs"]}


def tokenizer_only_repository(artifacts, tmp_path: Path) -> Path:
    """The engine target's preprocessing and postprocessing: quick to load, no torch."""
    repository = tmp_path / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=llama_31_8b_engine(tmp_path / "engine"),
            tokenizer_dir=artifacts["tokenizer"],
            serve=ServeSpec(),
            target="engine",
            out_dir=repository,
        )
    )
    for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        shutil.rmtree(repository / name)
    return repository


def test_detached_server_is_stopped_by_its_state_file(artifacts, tmp_path):
    repository = tokenizer_only_repository(artifacts, tmp_path)
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, exit_timeout_secs=5)
    state_dir = tmp_path / "serve-state"
    state = start_detached(options, state_dir, timeout=60)
    assert state.is_running() and is_ready(state.http_url)
    assert read_state(state_dir) == state
    stopped = stop_detached(state_dir)
    assert stopped.pid == state.pid and not state.is_running()
    assert read_state(state_dir) is None
    assert not list(leaks.SHM_DIR.glob(f"{state.shm_prefix}*"))
    assert not [d for d in state.python_env_dirs if Path(d).exists()]
    assert (state_dir / "tritonserver.last.log").is_file()
    with pytest.raises(Exception, match="no server is recorded"):
        stop_detached(state_dir)


def test_serve_foreground_prints_the_urls_and_stops_on_ctrl_c(artifacts, tmp_path):
    repository = tokenizer_only_repository(artifacts, tmp_path)
    http_port, grpc_port, metrics_port = free_ports(3)
    script = (
        "import sys; from pathlib import Path; from pipeline.serve import ServerOptions, serve_foreground; "
        f"sys.exit(serve_foreground(ServerOptions(model_repository=Path({str(repository)!r}), http_port={http_port}, "
        f"grpc_port={grpc_port}, metrics_port={metrics_port}, exit_timeout_secs=5)))"
    )
    process = subprocess.Popen([sys.executable, "-u", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    output = []
    try:
        while not any("Press Ctrl-C" in line for line in output):
            output.append(lines.get(timeout=60))
        assert is_ready(f"http://127.0.0.1:{http_port}")
        text = "".join(output)
        assert f"http://127.0.0.1:{http_port}" in text and f"127.0.0.1:{grpc_port}" in text and f":{metrics_port}/metrics" in text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not is_ready(f"http://127.0.0.1:{http_port}")


def test_a_repository_without_streaming_answers_unary_requests(artifacts, reference, tmp_path):
    """serve.decoupled false: unary gRPC ModelInfer and HTTP /infer work; a stream request is refused. The same
    server has serve.guided_decoding none: a guide is refused by name before any token."""
    repository = tmp_path / "model_repository"
    render_model_repository(
        RepositoryRequest(
            engine_dir=artifacts["engine"],
            tokenizer_dir=artifacts["tokenizer"],
            serve=ServeSpec(streaming=False, decoupled=False, guided_decoding="none"),
            target="cpu",
            out_dir=repository,
        )
    )
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, exit_timeout_secs=5)
    prompt = PROMPTS[0]
    with TritonServer(options) as triton:
        triton.wait_until_ready(timeout=120)
        with grpcclient.InferenceServerClient(options.grpc_url) as client:
            for model in ("ensemble", "tensorrt_llm_bls"):
                result = client.infer(model, client_inputs(prompt, MAX_TOKENS, stream=False))
                assert result.as_numpy("text_output").reshape(-1)[0].decode() == reference(prompt)
                guided = client_inputs(
                    prompt,
                    MAX_TOKENS,
                    stream=False,
                    guided_decoding_guide_type=(np.array([[b"json"]], dtype=np.object_), "BYTES"),
                )
                with pytest.raises(InferenceServerException, match=r"guided_decoding_guide_type: guided decoding is off on this server"):
                    client.infer(model, guided)
        http = httpclient.InferenceServerClient(options.http_url.removeprefix("http://"))
        try:

            def http_inputs(stream: bool):
                inputs = []
                for name, array, datatype in (
                    ("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
                    ("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
                    ("stream", np.array([[stream]], dtype=np.bool_), "BOOL"),
                ):
                    tensor = httpclient.InferInput(name, list(array.shape), datatype)
                    tensor.set_data_from_numpy(array)
                    inputs.append(tensor)
                return inputs

            assert http.infer("ensemble", http_inputs(False)).as_numpy("text_output").reshape(-1)[0].decode() == reference(prompt)
            with pytest.raises(InferenceServerException) as raised:
                http.infer("ensemble", http_inputs(True))
            assert raised.value.status() == "400"
            assert "streaming: streaming is only supported if the model is deployed in decoupled mode" in str(raised.value)
        finally:
            http.close()
        assert is_ready(options.http_url)
        assert triton.stop() == 0


# -- the launcher's own behaviour -------------------------------------------------------------
def test_command_binds_every_endpoint_to_the_configured_address(tmp_path):
    from pipeline.serve import find_tritonserver, server_command
    from pipeline.serve.installation import make_backend_directory, server_environment

    installation = find_tritonserver()
    options = ServerOptions(model_repository=tmp_path, http_port=1, grpc_port=2, metrics_port=3)
    command = server_command(installation, options, model_repository=tmp_path, backend_dir=tmp_path / "b")
    assert command[0] == str(installation.binary)
    for flag in (
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--disable-auto-complete-config",
        "--allow-gpu-metrics=false",
        f"--backend-config=python,shm-region-prefix-name={options.shm_prefix}",
    ):
        assert flag in command
    assert options.shm_prefix.startswith("triton_python_backend_shm_region_trtllmpipe_")
    backends = make_backend_directory(installation, tmp_path / "backends")
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"):
        assert (backends / "python" / name).resolve().is_file()
    env = server_environment({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x"})
    assert env["PATH"].split(":")[0] == str(Path(sys.prefix) / "bin")
    assert env["LD_LIBRARY_PATH"].endswith(":/x")


def test_stop_kills_the_whole_group_when_sigterm_is_ignored(tmp_path, monkeypatch):
    """A server (and its stub children) that ignore SIGTERM are SIGKILLed after the exit timeout."""
    from pipeline.serve import TritonInstallation, process
    from pipeline.serve import server as server_module

    root = tmp_path / "fake-tritonserver"
    (root / "bin").mkdir(parents=True)
    fake = root / "bin" / "tritonserver"
    ready = tmp_path / "ready"  # written once both processes ignore SIGTERM: no sleep that a loaded machine outruns
    fake.write_text(f"#!/bin/sh\ntrap '' TERM\nsh -c \"trap '' TERM; : > '{ready}.child'; sleep 300\" &\n: > '{ready}'\nsleep 300\n")
    fake.chmod(0o755)
    repository = tmp_path / "repo"
    repository.mkdir()
    monkeypatch.setattr(server_module, "_STOP_GRACE_SECONDS", 0.5)
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, exit_timeout_secs=0)
    triton = TritonServer(options, installation=TritonInstallation(root)).start()
    pid = triton.pid
    deadline = time.monotonic() + 60
    while not (ready.exists() and Path(f"{ready}.child").exists()):
        assert time.monotonic() < deadline and triton.is_running(), "the fake tritonserver never set its traps"
        time.sleep(0.02)
    started = time.monotonic()
    returncode = triton.stop()
    assert returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert not process.group_alive(pid), "a process of the server's group survived"


# -- the deployment's Prometheus rules, evaluated by a real Prometheus on this server -------------
PROMETHEUS = shutil.which("prometheus")


def _prometheus_query(url: str, path: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as response:
        return json.loads(response.read())["data"]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian: apt-get install prometheus)")
def test_a_real_prometheus_evaluates_the_rendered_rules_on_this_server(server, tmp_path):
    """pipeline.deploy.rules as the deployments render them, loaded by Prometheus scraping this tritonserver every
    second: every rule evaluates without error, and the autoscaling ratio and the per-token time come out of the
    families the server really exports."""
    import yaml

    from pipeline.config.spec import Spec
    from pipeline.deploy import rules
    from tests.pipeline.deploy.test_deploy import load_spec

    spec: Spec = load_spec("tiny-cpu")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules.rules_document(spec), sort_keys=False))
    [port] = free_ports(1)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            {
                "job_name": rules.TRITON_JOB,
                "static_configs": [{"targets": [f"127.0.0.1:{server.options.metrics_port}"], "labels": {rules.BUILD_LABEL: spec.name}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"]
    url = f"http://127.0.0.1:{port}/api/v1"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        up = f"/query?query=up%7Bjob%3D%22{rules.TRITON_JOB}%22%7D"
        assert _wait_for(lambda: _answers(url, up) and float(_prometheus_query(url, up)["result"][0]["value"][1]) == 1, 20), "no scrape"
        time.sleep(1.5)  # samples before the request
        for prompt in PROMPTS[:1]:
            assert http_generate(server.options.http_url, "ensemble", {"text_input": prompt, "max_tokens": MAX_TOKENS})[0] == 200

        def recorded(name: str) -> list[dict]:
            return _prometheus_query(url, f"/query?query={urllib.parse.quote(name)}")["result"]

        def ms_per_token_seen() -> bool:
            # the series exists as soon as two scrapes are in, possibly both taken before the requests were counted: wait
            # for the evaluation that sees them
            series = recorded(rules.MS_PER_TOKEN)
            return bool(recorded(rules.RATIO) and series and float(series[0]["value"][1]) > 0)

        assert _wait_for(ms_per_token_seen, 30), (tmp_path / "prometheus.log").read_text()[-2000:]
        [ratio] = recorded(rules.RATIO)
        assert ratio["metric"] == {"__name__": rules.RATIO, "build": spec.name, "model": "tensorrt_llm"} and float(ratio["value"][1]) >= 0
        print(f"{rules.RATIO} = {ratio['value'][1]}; {rules.MS_PER_TOKEN} = {recorded(rules.MS_PER_TOKEN)[0]['value'][1]}")
        assert float(recorded(rules.MS_PER_TOKEN)[0]["value"][1]) > 0
        assert 0 <= float(recorded(rules.KV_UTILIZATION)[0]["value"][1]) <= 1
        evaluated = [rule for group in _prometheus_query(url, "/rules")["groups"] for rule in group["rules"]]
        assert len(evaluated) == 14 and all(rule["health"] == "ok" for rule in evaluated), [r.get("lastError") for r in evaluated]
        assert not [rule["name"] for rule in evaluated if rule["type"] == "alerting" and rule["state"] == "firing"]
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(url: str, path: str) -> bool:
    try:
        return bool(_prometheus_query(url, path)["result"])
    except (OSError, ValueError, KeyError):
        return False

"""The OpenAI-compatible front end in front of the real tritonserver serving the packaged default config.

One Triton and one front end for the module (free loopback ports), on the front end's default route, the
ensemble (pipeline.serve.front_end_route); the answers are compared with the Triton client's through the
ensemble, and the `openai` command calls the BLS when told to. The official `openai` client,
streaming and not, gets the greedy answers the Triton client gets for the same prompt, with exact
usage; stop, n, seed and logprobs; every bad input of issue #7 gets its OpenAI-shaped 4xx and the
server keeps serving; an unreachable Triton is 503; a client that drops its SSE stream (or its
non-streamed request) frees the request's KV blocks; the `openai` command finds the server of
`serve --detach`, prints its URL and stops on SIGTERM. With API keys (#36, a second front end on the same
Triton): the official client with `api_key=`, 401s, a key at its concurrency limit refused while another is served,
`infer`, `bench load` and the performance gate sending the key, and the command never logging one.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import httpx
import openai
import pytest

from clients import RequestError, TritonLLMClient
from clients.api_keys import API_KEYS_VARIABLE, read_api_key_file
from clients.openai_server import AccessPolicy, KeyRing, ServedModel, running_openai_server
from clients.openai_server.templating import plain_chat_prompt
from model_repo.python.hf_tokenizer import HFTokenizer
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Target
from pipeline.serve import ServerState
from pipeline.serve.front_end_route import BLS_MODEL, front_end_triton_model, triton_version
from pipeline.serve.process import start_time_ticks
from tests.support import postprocessing_batches as batches
from tests.support.guided_cases import MAX_TOKENS as GUIDED_MAX_TOKENS
from tests.support.guided_cases import PROMPTS as GUIDED_PROMPTS
from tests.support.guided_cases import SCHEMAS as GUIDED_SCHEMAS
from tests.support.guided_cases import validated
from tests.support.serving import REPO, free_ports, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny-cpu"
PROMPTS = ["def foo(x):\n    return", "import os\n"]
MAX_TOKENS = 16
LONG = 900  # tokens: several seconds of generation
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def artifacts(private_tiny_cpu) -> dict[str, Path]:
    return private_tiny_cpu  # `serve --detach` writes its state into the store


@pytest.fixture(scope="module")
def triton(artifacts, tmp_path_factory):
    # Some cases call the BLS: Triton 2.51 may keep tensorrt_llm_bls loaded at stop (serving.STUCK_BLS), a warning
    with serving_repository(artifacts["repository"], tmp_path_factory.mktemp("serve"), allow_stuck_bls=True) as server:
        yield server


@pytest.fixture(scope="module")
def default_route(triton) -> str:
    """The Triton model the `openai` command calls on this server when not told."""
    return front_end_triton_model("ensemble")


@pytest.fixture(scope="module")
def base_url(triton, artifacts, default_route):
    with running_openai_server(
        triton.options.grpc_url,
        model_name=MODEL,
        model_repository=artifacts["repository"],
        max_body_bytes=BODY_LIMIT,
        triton_model=default_route,
    ) as url:
        yield url


@pytest.fixture(scope="module")
def oai(base_url):
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reference(triton):
    """The Triton client's greedy answer (with its token count) for a prompt."""
    with TritonLLMClient(triton.options.grpc_url, "grpc", timeout=60) as client:
        yield lambda prompt, max_tokens=MAX_TOKENS: client.generate(prompt, max_tokens=max_tokens, return_log_probs=True)


@pytest.fixture(scope="module")
def encode(artifacts):
    tokenizer = HFTokenizer(artifacts["tokenizer"])
    return lambda text: tokenizer.encode(text, add_special_tokens=True)


@pytest.fixture(scope="module")
def prompt_tokens(encode):
    return lambda text: len(encode(text))


def kv_blocks_used(triton) -> float:
    with urllib.request.urlopen(triton.options.metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("nv_trt_llm_kv_cache_block_metrics{") and 'kv_cache_block_type="used"' in line:
                return float(line.rpartition(" ")[2])
    raise KeyError("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=used} not in /metrics")


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# -- answers --------------------------------------------------------------------------------------
def test_the_bundled_triton_is_the_cpu_targets_and_its_default_route_is_the_ensemble(triton, default_route):
    """The version the cpu backend declares is the one the bundled server reports, and on it the front end defaults
    to the ensemble (front_end_route.py: the BLS deadlocks 2.51's Python backend under many concurrent streams)."""
    assert triton_version(triton.options.grpc_url) == backend_for(Target.cpu).triton_version == "2.51.0"
    assert default_route == "ensemble" != BLS_MODEL


def test_completions_equal_the_triton_clients_greedy_answers(oai, reference, prompt_tokens):
    for prompt in PROMPTS:
        expected = reference(prompt)
        answer = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert answer.choices[0].text == expected.text and answer.choices[0].finish_reason == expected.finish_reason
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_tokens(prompt), expected.num_tokens)
        chunks = list(
            oai.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True})
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
        assert chunks[-1].usage.model_dump() == answer.usage.model_dump() and not chunks[-1].choices


def test_chat_completions_equal_the_triton_clients_greedy_answers(oai, reference, prompt_tokens):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "class Parser:"}]
    prompt = plain_chat_prompt(messages)  # the tokenizer of the default model has no chat template
    expected = reference(prompt)
    answer = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert answer.choices[0].message.content == expected.text and answer.choices[0].message.role == "assistant"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt_tokens(prompt), expected.num_tokens)
    stream = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text


def test_stop_n_seed_and_logprobs(oai, reference):
    prompt = PROMPTS[1]
    full = reference(prompt).text
    stop = full[6:9]
    answer = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stop=[stop, "never"])
    assert answer.choices[0].text == full[: full.index(stop)] and answer.choices[0].finish_reason == "stop"

    sampled = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=1.0, seed=7)
    three = oai.completions.create(n=3, **sampled)
    assert [c.index for c in three.choices] == [0, 1, 2] and three.usage.completion_tokens == sum(
        len(c.logprobs.tokens) for c in oai.completions.create(n=3, logprobs=0, **sampled).choices
    )
    assert [c.text for c in three.choices] == [c.text for c in oai.completions.create(n=3, **sampled).choices]  # seeded
    assert oai.completions.create(**sampled).choices[0].text == three.choices[0].text  # choice 0 has the seed itself

    expected = reference(prompt, 8)
    logprobs = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0).choices[0].logprobs
    assert "".join(logprobs.tokens) == expected.text and len(logprobs.token_logprobs) == expected.num_tokens
    assert sum(logprobs.token_logprobs) == pytest.approx(expected.cum_log_prob, abs=1e-3)
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, temperature=0, logprobs=True)
    assert "".join(item.token for item in chat.choices[0].logprobs.content) == chat.choices[0].message.content


def test_prompt_logprobs_score_a_greedy_continuation_as_greedy(oai, encode):
    """What lm-eval's loglikelihood requests rely on: echo + logprobs over context + continuation token
    ids gives each continuation token its log-prob given what precedes it, and a greedy continuation
    is the most likely token at every position."""
    prompt = PROMPTS[0]
    generated = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=0).choices[0]
    context = encode(prompt)
    continuation = encode(prompt + generated.text)[len(context) :]
    assert continuation, generated.text
    for max_tokens in (0, 1):  # lm-eval asks for one token and drops it; 0 asks for none
        [choice] = oai.completions.create(model=MODEL, prompt=[context + continuation], max_tokens=max_tokens, temperature=0, logprobs=1, echo=True).choices
        scored = choice.logprobs
        assert len(scored.tokens) == len(context) + len(continuation) + max_tokens
        assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None  # nothing predicts the first token
        tail = range(len(context), len(context) + len(continuation))
        for position in tail:
            assert scored.token_logprobs[position] == pytest.approx(max(scored.top_logprobs[position].values()))
        assert scored.text_offset == sorted(scored.text_offset) and choice.text.startswith(prompt)
    assert [scored.token_logprobs[p] for p in tail] == pytest.approx(generated.logprobs.token_logprobs[: len(continuation)], abs=1e-4)


def test_token_id_prompts_answer_as_their_text(oai, encode):
    by_text = oai.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=8, temperature=0)
    by_ids = oai.completions.create(model=MODEL, prompt=[encode(prompt) for prompt in PROMPTS], max_tokens=8, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert by_ids.usage == by_text.usage
    [one] = oai.completions.create(model=MODEL, prompt=encode(PROMPTS[0]), max_tokens=0, echo=True).choices
    assert one.text == PROMPTS[0] and one.finish_reason == "length"  # echoed as postprocessing decodes it, nothing generated


def test_top_logprobs_are_sorted_alternatives_of_each_token(oai):
    answer = oai.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0, logprobs=3).choices[0]
    plain = oai.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0).choices[0]
    assert answer.text == plain.text and len(answer.logprobs.tokens) == 5
    for token, logprob, top in zip(answer.logprobs.tokens, answer.logprobs.token_logprobs, answer.logprobs.top_logprobs):
        values = list(top.values())
        assert 1 <= len(values) <= 3 and values == sorted(values, reverse=True)
        assert logprob == pytest.approx(values[0]) and top.get(token, values[0]) == pytest.approx(values[0])  # greedy: the best
    streamed = oai.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0, logprobs=3, stream=True)
    assert [t for chunk in streamed for t in (chunk.choices[0].logprobs.tokens if chunk.choices[0].logprobs else [])] == answer.logprobs.tokens
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    ).choices[0]
    for item in chat.logprobs.content:
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_logit_bias_forces_and_bans_tokens(oai, encode):
    forced = encode("import os\n")[-1]
    answer = oai.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=0, logit_bias={str(forced): 100})
    assert answer.usage.completion_tokens == 4 and len(set(answer.choices[0].logprobs.tokens)) == 1
    plain = oai.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1, temperature=0, logprobs=1).choices[0]
    [first] = plain.logprobs.top_logprobs[0]
    banned = encode(PROMPTS[0] + plain.text)[len(encode(PROMPTS[0])) :][:1]
    again = oai.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1, temperature=0, logit_bias={str(banned[0]): -100}).choices[0]
    assert again.text != plain.text and first


# -- bad inputs --------------------------------------------------------------------------------------
BAD_REQUESTS = [
    ("completions", b'{"model": "tiny-cpu", "prompt": ', 400, "invalid_json"),
    ("completions", b'{"prompt": "x"}', 400, "missing_required_parameter"),
    ("chat/completions", b'{"model": "tiny-cpu"}', 400, "missing_required_parameter"),
    ("completions", b'{"model": "gpt-4", "prompt": "x"}', 404, "model_not_found"),
    ("chat/completions", b'{"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "max_tokens": 0}', 400, "invalid_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "max_tokens": -3}', 400, "invalid_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "max_tokens": 1023}', 400, "context_length_exceeded"),
    ("chat/completions", b'{"model": "tiny-cpu", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}', 400, "context_length_exceeded"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "n": 9}', 400, "unsupported_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "n": "2"}', 400, "invalid_type"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "temperature": "hot"}', 400, "invalid_type"),
    ("chat/completions", b'{"model": "tiny-cpu", "messages": "hello"}', 400, "invalid_type"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "logprobs": 6}', 400, "invalid_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "echo": true, "logprobs": 1, "stream": true}', 400, None),
    ("completions", b'{"model": "tiny-cpu", "prompt": "x", "echo": true, "stream": true}', 400, None),
    ("completions", b'{"model": "tiny-cpu", "prompt": [1, 4096]}', 400, "invalid_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": [1, -5]}', 400, "invalid_value"),
    ("completions", b'{"model": "tiny-cpu", "prompt": [[1, 2], []]}', 400, "invalid_value"),
    ("completions", json.dumps({"model": "tiny-cpu", "prompt": [7] * 1000}).encode(), 400, "context_length_exceeded"),
    ("chat/completions", b'{"model": "tiny-cpu", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', 400, "invalid_value"),
    ("completions", json.dumps({"model": "tiny-cpu", "prompt": "x" * BODY_LIMIT}).encode(), 413, "request_too_large"),
]


def test_bad_inputs_get_openai_errors_and_the_server_keeps_serving(base_url, oai):
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for path, body, status, code in BAD_REQUESTS:
            response = http.post(f"/{path}", content=body, headers={"content-type": "application/json"})
            error = response.json()["error"]
            assert (response.status_code, error["code"]) == (status, code), (body[:80], error)
            assert error["param"] or code in ("invalid_json", "request_too_large"), error
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
            assert http.post("/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=0)


def test_an_unreachable_triton_is_503(artifacts):
    [closed_port] = free_ports(1)
    model = ServedModel.from_repository(artifacts["repository"], name=MODEL)
    with running_openai_server(f"127.0.0.1:{closed_port}", model_name=MODEL, model=model) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            for stream in (False, True):
                response = http.post("/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": stream})
                assert response.status_code == 503 and response.json()["error"]["code"] == "triton_unavailable"
            assert http.get(url.removesuffix("/v1") + "/health").status_code == 503 and http.get("/models").status_code == 200


def _front_end_counts(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return {name: float(value) for name, value in re.findall(r"^(trtllm_pipeline_openai_\w+_count) (\S+)$", text, re.M)}


def test_the_front_ends_metrics_count_each_choices_first_token_and_gaps(base_url, oai):
    """/metrics against the real server: one non-streamed request of k tokens adds one first token and k - 1 gaps."""
    before = _front_end_counts(base_url)
    completion = oai.completions.create(model=MODEL, prompt="def main(", max_tokens=8, temperature=0)
    tokens = completion.usage.completion_tokens
    after = _front_end_counts(base_url)
    ttft, itl = "trtllm_pipeline_openai_time_to_first_token_seconds_count", "trtllm_pipeline_openai_inter_token_latency_seconds_count"
    assert tokens > 1 and after[ttft] - before[ttft] == 1 and after[itl] - before[itl] == tokens - 1, (before, after, tokens)


# -- cancellation -------------------------------------------------------------------------------------
def test_a_dropped_sse_stream_frees_its_request(triton, oai, base_url):
    """Freed (the engine idle) having generated fewer than the LONG tokens asked for: cancelled, not run to its end.
    How soon is the machine's load, not asserted."""
    assert wait_for(lambda: kv_blocks_used(triton) == 0, 20.0), "the KV cache is not idle to begin with"
    before = batches.generated_when_idle(triton.options.metrics_url)
    stream = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x = ["}], max_tokens=LONG, temperature=0, stream=True)
    for index, _ in enumerate(stream):
        if index == 5:
            assert wait_for(lambda: kv_blocks_used(triton) > 0, 30.0), "the generation never showed in /metrics"
            break
    stream.close()  # the client goes away mid-stream
    after = batches.generated_when_idle(triton.options.metrics_url)
    assert after - before < LONG, f"the dropped stream's request ran to its end ({after - before} tokens)"

    # A non-streamed request whose client disconnects is cancelled too.
    host, port = base_url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    body = json.dumps({"model": MODEL, "prompt": "import", "max_tokens": LONG, "temperature": 0}).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        assert wait_for(lambda: kv_blocks_used(triton) > 0, 30.0), "the generation never showed in /metrics"
    generated = batches.generated_when_idle(triton.options.metrics_url) - after
    assert generated < LONG, f"a disconnected non-streamed request kept running ({generated} tokens)"
    assert oai.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].text is not None


# -- the command ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _openai_command(*args: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """`python -m pipeline openai ...` from this checkout; the process and the lines it printed, the base URL last.
    A process the test did not stop is killed on the way out."""
    command = [sys.executable, "-m", "pipeline", *args, "--port", "0"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not (lines and lines[-1].startswith("http://")):
            line = process.stdout.readline()
            if not line:
                process.kill()
                raise AssertionError(f"exited {process.wait()} before printing its URL: {''.join(lines)} {process.stderr.read()}")
            lines.append(line.strip())
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_openai_command_uses_the_detached_server_and_stops_on_sigterm(triton, artifacts):
    state_dir = artifacts["root"] / MODEL / ".serve"
    state = ServerState(
        pid=triton.pid,
        start_ticks=start_time_ticks(triton.pid),
        command=triton.command,
        http_url=triton.options.http_url,
        grpc_url=triton.options.grpc_url,
        metrics_url=triton.options.metrics_url,
        log_path=str(triton.log_path),
        shm_prefix=triton.options.shm_prefix,
        python_env_dirs=[],
        exit_timeout_secs=5,
        workspace=str(triton.workspace),
        model_repository=str(artifacts["repository"]),
        started_at="now",
    )  # as `serve --detach` records it
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "server.json").write_text(json.dumps(asdict(state)))
    try:
        with _openai_command("--artifacts", str(artifacts["root"]), "openai", str(REPO / "build_configs" / f"{MODEL}.yaml")) as (process, lines):
            assert "started with `serve --detach`" in lines[0] and "model 'ensemble'" in lines[1]
            with httpx.Client(base_url=lines[-1], timeout=30) as http:
                assert http.get("/models").json()["data"][0]["id"] == MODEL
                assert http.post("/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}).json()["usage"]["completion_tokens"] == 2
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == 0
    finally:
        (state_dir / "server.json").unlink()
    assert triton.is_running()  # the command never stops a server it did not start


@pytest.mark.parametrize("triton_model", [None, BLS_MODEL])
def test_the_openai_command_with_a_triton_url_reads_what_that_triton_serves(triton, artifacts, reference, triton_model):
    """Issue #32: with --triton-url the facts (here gather_context_logits) come from the Triton, not the spec's defaults,
    so lm-eval's loglikelihood requests (echo + logprobs) answer as without the URL. Unless told (`--triton-model
    tensorrt_llm_bls`), it calls the ensemble, the default route; a streamed greedy completion answers as the ensemble does."""
    config = str(REPO / "build_configs" / f"{MODEL}.yaml")
    choice = ["--triton-model", triton_model] if triton_model else []
    with _openai_command("--artifacts", str(artifacts["root"]), "openai", config, "--triton-url", triton.options.grpc_url, *choice) as (process, lines):
        assert f"model {triton_model or 'ensemble'!r}" in lines[0]
        with httpx.Client(base_url=lines[-1], timeout=30) as http:
            with http.stream(
                "POST", "/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
            ) as streamed:
                events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1]) == reference(PROMPTS[0]).text
            response = http.post(
                "/completions",
                json={
                    "model": MODEL,
                    "prompt": "def foo(x):\n    return x",
                    "max_tokens": 1,
                    "temperature": 0,
                    "logprobs": 1,
                    "echo": True,
                },
            )
            assert response.status_code == 200, response.text
            logprobs = response.json()["choices"][0]["logprobs"]
            assert logprobs["token_logprobs"][0] is None and all(value <= 0 for value in logprobs["token_logprobs"][1:])
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    assert triton.is_running()


class _NotTriton(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("case", ["closed port", "another model", "not triton"])
def test_the_openai_command_with_a_bad_triton_url_says_what_it_found_and_exits_1(case, request):
    """Nothing there, a Triton without the model, an HTTP server that is not Triton's gRPC: one error line naming the URL, exit 1."""
    config = str(REPO / "build_configs" / f"{MODEL}.yaml")
    extra, expected = [], ""
    with contextlib.ExitStack() as stack:
        if case == "closed port":
            [port] = free_ports(1)
            url, expected = f"127.0.0.1:{port}", "nothing answers there"
        elif case == "another model":
            url, expected = request.getfixturevalue("triton").options.grpc_url, "does not serve model 'no-such-model' (it serves: "
            extra = ["--triton-model", "no-such-model"]
        else:
            server = http.server.HTTPServer(("127.0.0.1", 0), _NotTriton)
            stack.enter_context(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.shutdown)
            url, expected = f"127.0.0.1:{server.server_port}", "no Triton gRPC API answers there"
        [front_port] = free_ports(1)
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "--artifacts",
                str(request.getfixturevalue("tmp_path")),
                "openai",
                config,
                "--triton-url",
                url,
                *extra,
                "--port",
                str(front_port),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, (done.stdout, done.stderr)
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert url in error and expected in error, done.stderr
    assert "http://" not in done.stdout and time.monotonic() - started < 60
    with socket.socket() as probe:  # nothing is left listening on the front end's port
        probe.bind(("127.0.0.1", front_port))


# -- guided decoding (#16): the tiny model, which writes Python, answers JSON that validates ---------------
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_guided_answers_over_triton_grpc_and_http_validate_against_their_schemas(triton, protocol):
    url = triton.options.grpc_url if protocol == "grpc" else triton.options.http_url
    with TritonLLMClient(url, protocol, timeout=120) as client:
        for name, schema in GUIDED_SCHEMAS.items():
            for prompt in GUIDED_PROMPTS:
                for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.95, "seed": 3}):
                    answer = client.generate(
                        prompt,
                        max_tokens=GUIDED_MAX_TOKENS,
                        return_log_probs=True,
                        **sampling,
                        guided_decoding_guide_type="json_schema",
                        guided_decoding_guide=json.dumps(schema),
                    )
                    assert answer.finish_reason == "stop", (name, prompt, answer.text)
                    validated(answer.text, schema)


def test_every_guided_beam_over_triton_validates_against_its_schema(triton):
    """beam_width 4 (the served spec's max_beam_width): each beam follows its own grammar state."""
    with TritonLLMClient(triton.options.grpc_url, "grpc", timeout=120) as client:
        for name, schema in GUIDED_SCHEMAS.items():
            answer = client.generate(
                GUIDED_PROMPTS[0],
                max_tokens=GUIDED_MAX_TOKENS,
                beam_width=4,
                return_log_probs=True,
                guided_decoding_guide_type="json_schema",
                guided_decoding_guide=json.dumps(schema),
            )
            assert len(answer.beams) == 4 and len(set(answer.beams)) > 1, (name, answer.beams)
            for text in answer.beams:
                validated(text, schema)


def test_guided_answers_through_the_openai_front_end_validate(oai):
    for name, schema in GUIDED_SCHEMAS.items():
        response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        for prompt in GUIDED_PROMPTS:
            completion = oai.completions.create(
                model=MODEL, prompt=prompt, max_tokens=GUIDED_MAX_TOKENS, temperature=0, extra_body={"response_format": response_format}
            )
            assert completion.choices[0].finish_reason == "stop"
            validated(completion.choices[0].text, schema)
            chat = oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=GUIDED_MAX_TOKENS,
                temperature=1.0,
                seed=5,
                n=2,
                response_format=response_format,
            )
            for choice in chat.choices:
                assert choice.finish_reason == "stop"
                validated(choice.message.content, schema)
    json_object = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=GUIDED_MAX_TOKENS, temperature=0, response_format={"type": "json_object"}
    )
    json_choice = json_object.choices[0]  # any object: the tiny model may keep adding keys until max_tokens
    assert json_choice.message.content.startswith("{")
    assert json_choice.finish_reason == "length" or isinstance(json.loads(json_choice.message.content), dict)
    regex = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=12, temperature=0, extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", regex.choices[0].text) and regex.choices[0].finish_reason == "stop"
    grammar = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=12, temperature=0, extra_body={"guided_grammar": 'root ::= "yes" | "no"'})
    assert grammar.choices[0].text in ("yes", "no")


def test_a_guide_that_cannot_finish_within_max_tokens_ends_with_length(oai):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": GUIDED_SCHEMAS["person"]}}
    completion = oai.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0, extra_body={"response_format": response_format})
    assert completion.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(completion.choices[0].text)


@pytest.mark.parametrize(
    "body, param, reason",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}, "response_format", "not a valid JSON schema"),
        ({"guided_json": {"not": {"type": "string"}}}, "guided_json", "keyword 'not'"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "xgrammar cannot compile the regex guide"),
        ({"guided_grammar": 'root ::= ""'}, "guided_grammar", "accepts only the empty output"),
        ({"guided_regex": "[0-9]", "guided_grammar": 'root ::= "a"'}, "guided_grammar", "give one guide"),
    ],
    ids=["invalid-schema", "unsupported-keyword", "bad-regex", "empty-grammar", "two-guides"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_guides_are_a_400_naming_the_guide_before_any_token(base_url, body, param, reason, stream):
    """The error names the request's field (the `param` and the message), not Triton's input."""
    payload = {"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": stream, **body}
    response = httpx.post(f"{base_url}/completions", json=payload, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert reason in error["message"] and error["param"] == param, error
    assert "guided_decoding_guide" not in error["message"]


def test_triton_refuses_a_guide_type_without_a_guide_and_a_1_mb_schema_by_name(triton):
    megabyte_schema = json.dumps({"enum": ["a" * (1 << 20)]})
    with TritonLLMClient(triton.options.grpc_url, "grpc", timeout=60) as client:
        with pytest.raises(RequestError, match="guided_decoding_guide: guide type 'json_schema' needs a guide"):
            client.generate("x", max_tokens=4, guided_decoding_guide_type="json_schema")
        with pytest.raises(RequestError, match=r"guided_decoding_guide: is 10485\d\d bytes; at most 65536 bytes"):
            client.generate("x", max_tokens=4, guided_decoding_guide_type="json_schema", guided_decoding_guide=megabyte_schema)


def test_the_bls_passes_the_guide_to_tensorrt_llm(triton):
    with TritonLLMClient(triton.options.grpc_url, "grpc", "tensorrt_llm_bls", timeout=60) as client:
        answer = client.generate("x = ", max_tokens=12, guided_decoding_guide_type="regex", guided_decoding_guide="[0-9]{3}-[a-z]{2}")
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", answer.text)


def test_the_performance_gate_measures_an_openai_url_serving_another_name(triton, artifacts, key_file, monkeypatch):
    """gate.performance.url against an OpenAI-compatible server that serves its model under another name than the
    build's, as trtllm-serve does (it serves the name of its model directory, `engine`). Stand-in for trtllm-serve
    (not run here: no GPU): the project's own front end on this module's Triton, serving the name `engine`; the gate
    reads the name from /v1/models and passes. The server asks for an API key, which the gate takes from
    TRTLLM_PIPELINE_API_KEYS."""
    from pipeline.cli import main

    monkeypatch.setenv(API_KEYS_VARIABLE, f"gate:{KEY_A}")  # the gate sends the variable's first key (#36)
    keys = AccessPolicy(KeyRing(read_api_key_file(key_file)))
    with running_openai_server(triton.options.grpc_url, model_name="engine", model_repository=artifacts["repository"], access=keys) as url:
        gate = [
            "gate.performance.endpoint=openai",
            f"gate.performance.url={url}",
            "gate.performance.num_requests=4",
            "gate.performance.warmup_requests=0",
            "gate.performance.concurrency=2",
            "gate.performance.input_tokens=16",
            "gate.performance.output_tokens=4",
            "gate.performance.max_e2e_ms.p99=60000",
        ]
        code = main(
            [
                "--artifacts",
                str(artifacts["root"]),
                "run",
                str(REPO / "build_configs" / "tiny-cpu.yaml"),
                "--until",
                "slo",
                *(token for setting in gate for token in ("--set", setting)),
            ]
        )
    assert code == 0
    [report_path] = sorted((artifacts["root"] / MODEL).glob("slo-*/performance.json"))
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "passed" and report["point"]["completed"] == 4 and report["point"]["endpoint"] == "openai"


# -- API keys (#36): a second front end, asking for keys, on this module's Triton -----------------------------------
KEY_A, KEY_B = "integration-key-a-0123456789", "integration-key-b-0123456789"
WRONG_KEY = "integration-key-c-0123456789"


@pytest.fixture(scope="module")
def key_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# the test's clients\nalice:{KEY_A}\n\n{KEY_B}   \n")  # a blank line and trailing whitespace
    return path


@pytest.fixture(scope="module")
def keyed_url(triton, artifacts, key_file):
    access = AccessPolicy(KeyRing(read_api_key_file(key_file)), max_concurrent_per_key=1)
    with running_openai_server(triton.options.grpc_url, model_name=MODEL, model_repository=artifacts["repository"], access=access) as url:
        yield url


def test_with_keys_the_official_client_is_served_with_its_key_and_refused_without(keyed_url, reference):
    expected = reference(PROMPTS[0], 8).text
    with openai.OpenAI(base_url=keyed_url, api_key=KEY_A, max_retries=0, timeout=60) as client:
        assert [model.id for model in client.models.list()] == [MODEL]
        assert client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0).choices[0].text == expected
        chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, temperature=0)
        assert chat.choices[0].message.content
        streamed = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == expected
    with openai.OpenAI(base_url=keyed_url, api_key=WRONG_KEY, max_retries=0, timeout=60) as wrong:
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert refused.value.body["code"] == "invalid_api_key" and WRONG_KEY not in str(refused.value)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    for path in ("/models", "/completions"):
        response = (
            httpx.post(f"{keyed_url}{path}", json={"model": MODEL, "prompt": "x"}, timeout=30)
            if path != "/models"
            else httpx.get(f"{keyed_url}{path}", timeout=30)
        )
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed_url.removesuffix("/v1") + "/health", timeout=30).status_code == 200


def test_a_key_at_its_limit_gets_429_while_the_other_key_is_served(keyed_url):
    """alice holds her one slot with a long stream: her next request is 429 with Retry-After, bob's is served;
    once her stream is gone, she is served again."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    with openai.OpenAI(base_url=keyed_url, api_key=KEY_A, max_retries=0, timeout=60) as alice:
        stream = alice.completions.create(model=MODEL, prompt="import", max_tokens=LONG, temperature=0, stream=True)
        next(iter(stream))
        refused = httpx.post(f"{keyed_url}/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded" and "'alice'" in refused.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError):
            alice.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        served = httpx.post(f"{keyed_url}/completions", json=body, headers={"Authorization": f"Bearer {KEY_B}"}, timeout=60)
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2
        stream.close()

        def alice_served() -> bool:
            return httpx.post(f"{keyed_url}/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60).status_code == 200

        assert wait_for(alice_served, 10.0), "alice's slot was not given back after her stream closed"
    metrics = httpx.get(keyed_url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert re.search(r'requests_total\{endpoint="/v1/completions",key="alice",status="429"\} [1-9]', metrics), metrics
    assert re.search(r'requests_total\{endpoint="/v1/completions",key="key2",status="200"\} [1-9]', metrics)
    assert KEY_A not in metrics and KEY_B not in metrics


def test_infer_and_bench_load_send_the_key(keyed_url, key_file, artifacts, tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    monkeypatch.delenv(API_KEYS_VARIABLE, raising=False)
    infer = ["infer", "--protocol", "openai", "--url", keyed_url, "--max-tokens", "4", "def f("]
    assert main([*infer, "--api-key-file", str(key_file)]) == 0
    plain = capsys.readouterr().out
    assert main([*infer, "--api-key-file", str(key_file), "--stream", "--json"]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert plain.strip() and streamed["text"] + "\n" == plain and streamed["protocol"] == "openai"
    monkeypatch.setenv(API_KEYS_VARIABLE, f"ci:{KEY_B}")  # the variable when no file is given
    assert main([*infer, "--stream"]) == 0 and capsys.readouterr().out == plain
    monkeypatch.delenv(API_KEYS_VARIABLE)
    assert main(infer) == 1
    err = capsys.readouterr().err
    assert "[401] You didn't provide an API key" in err and "--api-key-file" in err

    out = tmp_path / "bench"
    code = main(
        [
            "--artifacts",
            str(artifacts["root"]),
            "bench",
            "load",
            str(REPO / "build_configs" / f"{MODEL}.yaml"),
            "--endpoint",
            "openai",
            "--url",
            keyed_url,
            "--api-key-file",
            str(key_file),
            "--concurrency",
            "1",
            "--requests",
            "3",
            "--warmup",
            "0",
            "--input-tokens",
            "16",
            "--output-tokens",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    [point] = json.loads((out / "bench-serve-load.json").read_text())["points"]
    assert (point["completed"], point["failed"], point["output_tokens"]) == (3, 0, 12), point["errors"]


def _raw_status(base_url: str, header: str, body: bytes) -> int:
    """The status of a POST /v1/completions sent byte for byte, with `header` as written."""
    host, port = base_url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{header}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        status_line = connection.makefile("rb").readline().decode()
    return int(status_line.split()[1])


def test_the_openai_command_with_a_key_file_refuses_bad_authorizations_and_never_logs_a_key(triton, artifacts, key_file):
    """The command's whole output (uvicorn's log included) over every bad Authorization of the issue holds no key."""
    config = str(REPO / "build_configs" / f"{MODEL}.yaml")
    with _openai_command(
        "--artifacts",
        str(artifacts["root"]),
        "openai",
        config,
        "--triton-url",
        triton.options.grpc_url,
        "--api-key-file",
        str(key_file),
        "--max-concurrent-per-key",
        "2",
    ) as (process, lines):
        assert "API keys: alice, key2; at most 2 concurrent requests per key" in "\n".join(lines)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        with httpx.Client(base_url=lines[-1], timeout=60) as http:
            for value, status in [
                (None, 401),
                (f"Bearer {WRONG_KEY}", 401),
                (f"Basic {KEY_A}", 401),
                (KEY_A, 401),
                ("Bearer " + "w" * 10_240, 401),
                (f"bearer {KEY_B}", 200),
            ]:
                response = http.post("/completions", json=body, headers={"Authorization": value} if value else {})
                assert response.status_code == status, (value[:20] if value else None, response.text)
                assert KEY_A not in response.text and WRONG_KEY not in response.text
            # trailing whitespace after the key, as a hand-written client may send it (httpx refuses to)
            assert _raw_status(lines[-1], f"Authorization: Bearer {KEY_A}  \t", json.dumps(body).encode()) == 200
            streamed = http.post("/completions", json={**body, "stream": True}, headers={"Authorization": f"Bearer {KEY_A}"})
            assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
            huge = http.post("/completions", json=body, headers={"Authorization": "Bearer " + "w" * 65_536})
            assert 400 <= huge.status_code < 500  # 401, or uvicorn's 400 when the header block arrives in pieces over 16 KiB
        with httpx.Client(base_url=lines[-1], timeout=60) as http:  # and the server keeps serving
            assert http.get("/models", headers={"Authorization": f"Bearer {KEY_B}"}).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        output = "\n".join(lines) + process.stdout.read() + process.stderr.read()
    for secret in (KEY_A, KEY_B, WRONG_KEY, "w" * 64):
        assert secret not in output, output[-2000:]

"""The clients package against the real tritonserver serving the packaged default config.

One server for the module (free loopback ports). Answers over HTTP and gRPC equal refengine's own
greedy output; streamed deltas concatenate to the generated text; the asyncio client; 16
concurrent streaming clients; bad requests raise RequestError with Triton's message and are not
retried; an unreachable server raises ServerUnavailableError after the configured retries;
breaking out of a gRPC stream frees the server's KV blocks; timeouts raise ClientTimeoutError;
the `infer` command. The clients are used only through their public API.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from clients import AsyncTritonLLMClient, ClientError, ClientTimeoutError, InvalidRequestError, RequestError, ServerUnavailableError, TritonLLMClient
from clients.cli import add_infer_arguments, run_infer
from clients.retry import RetryPolicy
from tests.support import postprocessing_batches as batches
from tests.support.serving import REPO, free_ports, greedy_reference, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROTOCOLS = ["grpc", "http"]
PROMPTS = [
    "def foo(x):\n    return",
    "import os\n",
    'class Foo:\n    """',
    "for i in range(",
    "# Copyright",
    "with open(path) as f:\n",
    "x = [",
    "if __name__ == ",
]
MAX_TOKENS = 24
LONG = 900  # tokens: several seconds of generation on this machine


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def artifacts(tiny_cpu) -> dict[str, Path]:
    """The default config built and packaged by the pipeline itself (shared by the session)."""
    return tiny_cpu


@pytest.fixture(scope="module")
def reference(artifacts):
    """refengine's greedy text for a prompt, computed in this process on the same engine."""
    return greedy_reference(artifacts["engine"], artifacts["tokenizer"], MAX_TOKENS)


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    with serving_repository(artifacts["repository"], tmp_path_factory.mktemp("serve")) as triton:
        yield triton


def url_of(server, protocol: str) -> str:
    return server.options.grpc_url if protocol == "grpc" else server.options.http_url


@pytest.fixture(params=PROTOCOLS)
def client(request, server):
    with TritonLLMClient(url_of(server, request.param), request.param, timeout=60) as client:
        yield client


def kv_blocks_used(server) -> float:
    with urllib.request.urlopen(server.options.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
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


def wait_until_idle(server, timeout: float = 20.0) -> None:
    assert wait_for(lambda: kv_blocks_used(server) == 0, timeout), "the server's KV cache is not idle"


def generated_when_idle(server) -> int:
    return batches.generated_when_idle(server.options.metrics_url)


@pytest.fixture
def never_retried(monkeypatch):
    """Any retry fails the test at once: what a request Triton answered must never get (no timing needed)."""

    def retried(policy, retry: int) -> float:
        raise AssertionError(f"retry {retry}: a request the server answered, or one past its timeout, was retried")

    monkeypatch.setattr(RetryPolicy, "delay", retried)


def ensemble_requests_done(server) -> int:
    """Requests the ensemble has finished (succeeded, failed or cancelled), from Triton's statistics."""
    with urllib.request.urlopen(f"{server.options.http_url}/v2/models/ensemble/stats", timeout=10) as response:
        [stats] = json.loads(response.read())["model_stats"]
    return stats["inference_stats"]["success"]["count"] + stats["inference_stats"]["fail"]["count"]


def wait_until_done(server, count: int, timeout: float = 30.0) -> None:
    """Until the ensemble has finished `count` requests: a request the client gave up on may
    still run on the server (HTTP, or a non-streamed one), and stopping the server under it
    would not be clean."""
    assert wait_for(lambda: ensemble_requests_done(server) >= count, timeout), "requests still running on the server"


# -- answers ----------------------------------------------------------------------------------
def test_generate_equals_refengine_greedy_output(client, reference):
    for prompt in PROMPTS[:3]:
        completion = client.generate(prompt, max_tokens=MAX_TOKENS)
        assert completion.text == reference(prompt)
        assert completion.protocol == client.protocol and completion.num_responses == 1
        assert 0 < completion.latency_s < 30


def test_stream_deltas_concatenate_to_the_generated_text(client, reference):
    for prompt in PROMPTS[:3]:
        stream = client.stream(prompt, max_tokens=MAX_TOKENS)
        deltas = list(stream)
        assert len(deltas) > 1 and all("\ufffd" not in delta for delta in deltas)
        assert "".join(deltas) == client.generate(prompt, max_tokens=MAX_TOKENS).text == reference(prompt)
        assert stream.completion.text == "".join(deltas)
        assert stream.completion.time_to_first_response_s <= stream.completion.latency_s


def test_log_probs_give_token_count_and_finish_reason(client, reference):
    prompt = "import os\n"
    whole = client.generate(prompt, max_tokens=MAX_TOKENS, return_log_probs=True)
    assert (whole.num_tokens, whole.finish_reason) == (MAX_TOKENS, "length")
    stopped = client.generate(prompt, max_tokens=MAX_TOKENS, stop="\n", return_log_probs=True)
    assert stopped.text == reference(prompt, stop_words=("\n",)) != whole.text
    assert stopped.finish_reason == "stop" and stopped.num_tokens < MAX_TOKENS
    streamed = client.stream(prompt, max_tokens=MAX_TOKENS, return_log_probs=True)
    assert "".join(streamed) == whole.text
    assert streamed.completion.num_tokens == MAX_TOKENS
    assert streamed.completion.cum_log_prob == pytest.approx(whole.cum_log_prob, rel=1e-4)


def test_stream_beams_gives_every_beam_whole_each_step_and_ends_at_the_generated_beams(client):
    """Beams whole at every step (each item replaces the last), the last item the beams generate() returns, with their
    cum_log_probs; the delta stream refuses beams by name."""
    expected = client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, beam_width=3, return_log_probs=True)
    stream = client.stream_beams(PROMPTS[0], max_tokens=MAX_TOKENS, beam_width=3, return_log_probs=True)
    steps = list(stream)
    assert len(steps) > 2 and all(len(beams) == 3 for beams in steps)
    assert steps[-1] == stream.completion.beams == expected.beams and len(set(expected.beams)) > 1
    assert stream.completion.text == expected.text == expected.beams[0]
    assert stream.completion.beam_cum_log_probs == pytest.approx(expected.beam_cum_log_probs, abs=1e-4)
    with pytest.raises(InvalidRequestError, match="beam_width 3 is not streamed as text deltas") as refused:
        client.stream(PROMPTS[0], max_tokens=MAX_TOKENS, beam_width=3)
    assert refused.value.field == "beam_width"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_client(server, reference, protocol):
    async def main():
        async with AsyncTritonLLMClient(url_of(server, protocol), protocol) as client:
            assert await client.is_ready()
            single = await client.generate(PROMPTS[0], max_tokens=MAX_TOKENS)
            deltas = [delta async for delta in client.stream(PROMPTS[1], max_tokens=MAX_TOKENS)]
            many = await asyncio.gather(*(client.generate(prompt, max_tokens=MAX_TOKENS) for prompt in PROMPTS[:4]))
            with pytest.raises(RequestError, match="max_tokens must be at least 1, got 0"):
                await client.generate("x", max_tokens=0)
            beams = client.stream_beams(PROMPTS[0], max_tokens=MAX_TOKENS, beam_width=2)
            steps = [step async for step in beams]
            assert steps[-1] == beams.completion.beams == (await client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, beam_width=2)).beams
            return single.text, deltas, [completion.text for completion in many]

    single, deltas, many = asyncio.run(main())
    assert single == reference(PROMPTS[0])
    assert len(deltas) > 1 and "".join(deltas) == reference(PROMPTS[1])
    assert many == [reference(prompt) for prompt in PROMPTS[:4]]


def test_sixteen_concurrent_streaming_clients_get_their_own_texts(server, reference):
    """Threads 0-7 each open their own client, 8-15 share one client per protocol; HTTP and gRPC alternate."""
    expected = {prompt: reference(prompt) for prompt in PROMPTS}
    shared = {protocol: TritonLLMClient(url_of(server, protocol), protocol) for protocol in PROTOCOLS}
    start = threading.Barrier(16)
    results: dict[int, tuple[str, str]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        protocol, prompt = PROTOCOLS[index % 2], PROMPTS[index % len(PROMPTS)]
        own = TritonLLMClient(url_of(server, protocol), protocol) if index < 8 else None
        try:
            client = own or shared[protocol]
            start.wait(30)
            results[index] = (prompt, "".join(client.stream(prompt, max_tokens=MAX_TOKENS)))
        except BaseException as error:  # collected and re-raised in the test thread
            errors.append(error)
        finally:
            if own is not None:
                own.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        for client in shared.values():
            client.close()
    assert not errors, errors
    assert len(results) == 16
    assert all(text == expected[prompt] for prompt, text in results.values()), results


# -- errors -----------------------------------------------------------------------------------
BAD_REQUESTS = {
    "max_tokens zero": ("x", 0, "max_tokens must be at least 1, got 0"),
    "prompt too long": ("x " * 2000, 4, "text_input encodes to 2002 tokens, more than the engine's max_input_len 768"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_raise_request_error_with_the_servers_message_and_no_retry(server, protocol, case, never_retried):
    prompt, max_tokens, message = BAD_REQUESTS[case]
    with TritonLLMClient(url_of(server, protocol), protocol, retries=3, retry_backoff_s=5.0) as client:
        for call in (client.generate, lambda *a, **k: "".join(client.stream(*a, **k))):
            with pytest.raises(RequestError) as raised:  # never_retried: a retry raises AssertionError instead
                call(prompt, max_tokens=max_tokens)
            assert message in raised.value.message
            # HTTP carries the status; Triton reports a gRPC stream's error with a message only.
            assert raised.value.status == (400 if protocol == "http" else None)
        assert client.is_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_closed_port_raises_a_connection_error_after_the_retries(protocol):
    [port] = free_ports(1)
    retries, backoff = 2, 0.05
    with TritonLLMClient(f"127.0.0.1:{port}", protocol, retries=retries, retry_backoff_s=backoff) as client:
        assert not client.is_ready()
        for call in (client.generate, lambda *a, **k: list(client.stream(*a, **k))):
            started = time.monotonic()
            with pytest.raises(ServerUnavailableError) as raised:
                call("x", max_tokens=4)
            elapsed = time.monotonic() - started
            assert raised.value.attempts == retries + 1
            assert f"127.0.0.1:{port}" in str(raised.value) and isinstance(raised.value, ConnectionError)
            # waited 0.05 + 0.1 between the attempts (a floor: sleeps never end early); the ceiling only says no attempt
            # waited for the client's 60 s timeout, generous for a loaded machine
            assert backoff * 3 <= elapsed < 30.0

    async def main():
        async with AsyncTritonLLMClient(f"127.0.0.1:{port}", protocol, retries=1, retry_backoff_s=0.01) as client:
            await client.generate("x", max_tokens=4)

    with pytest.raises(ServerUnavailableError, match=r"\(2 attempts\)"):
        asyncio.run(main())


# -- cancellation and timeouts ----------------------------------------------------------------
def test_breaking_out_of_a_grpc_stream_frees_the_servers_kv_blocks(server):
    """The KV blocks are freed (the engine idle) and the request generated fewer than its LONG tokens: cancelled, not
    run to its end (how soon depends on the machine's load, so it is not asserted)."""
    wait_until_idle(server)
    before = generated_when_idle(server)
    with TritonLLMClient(server.options.grpc_url, "grpc") as client:
        for index, _ in enumerate(client.stream(PROMPTS[0], max_tokens=LONG)):
            if index == 5:
                assert wait_for(lambda: kv_blocks_used(server) > 0, 30.0), "the generation never showed in /metrics"
                break  # the dropped stream cancels its request
        after = generated_when_idle(server)
        assert after - before < LONG, f"the dropped stream's request ran to its end ({after - before} tokens)"

        stream = client.stream(PROMPTS[1], max_tokens=LONG)  # cancel() from another thread
        received = []
        consumer = threading.Thread(target=lambda: received.extend(stream))
        consumer.start()
        assert wait_for(lambda: len(received) >= 3, 60.0)
        stream.cancel()
        consumer.join(60)
        assert not consumer.is_alive() and stream.cancelled and stream.completion is None
        generated = generated_when_idle(server) - after
        assert generated < LONG, f"the cancelled stream's request ran to its end ({generated} tokens)"
        assert client.generate(PROMPTS[0], max_tokens=4).text  # the client still works


def test_a_grpc_stream_left_open_does_not_hold_up_the_interpreters_exit(server):
    """tritonclient reads a stream in a non-daemon thread; an unclosed stream is cancelled at exit."""
    done_before = ensemble_requests_done(server)
    script = (
        "from clients import TritonLLMClient\n"
        f"stream = TritonLLMClient({server.options.grpc_url!r}).stream('x = [', max_tokens={LONG})\n"
        "print(next(stream) != '', flush=True)\n"
    )
    before = generated_when_idle(server)
    # the exit is not held up until the stream's end: timeout=60 bounds a hang, and the token count shows the
    # request was cancelled at exit rather than waited for (how fast the interpreter starts is the machine's)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
    wait_until_done(server, done_before + 1)
    generated = generated_when_idle(server) - before
    assert generated < LONG, f"the request left open ran to its end ({generated} tokens): the exit waited for it"


def test_closing_an_async_grpc_stream_frees_the_servers_kv_blocks(server):
    wait_until_idle(server)
    before = generated_when_idle(server)

    async def main():
        async with AsyncTritonLLMClient(server.options.grpc_url, "grpc") as client:
            async with client.stream(PROMPTS[0], max_tokens=LONG) as stream:
                async for _ in stream:
                    if kv_blocks_used(server) > 0:
                        break
            return stream.cancelled, stream.completion

    assert asyncio.run(main()) == (True, None)
    generated = generated_when_idle(server) - before  # idle: the KV blocks freed
    assert generated < LONG, f"the closed stream's request ran to its end ({generated} tokens)"


def test_breaking_out_of_an_http_stream_stops_at_once(server, reference):
    """The client stops reading and closes its connection. Triton 2.51 has no HTTP cancellation,
    so the server finishes the request on its own (use gRPC to free the server at once)."""
    wait_until_idle(server)
    done_before = ensemble_requests_done(server)
    with TritonLLMClient(server.options.http_url, "http") as client:
        with client.stream(PROMPTS[0], max_tokens=300) as stream:
            for index, _ in enumerate(stream):
                if index == 3:
                    break
        # cancelled, not read to its end: a stream that reached its final response is finished and never
        # cancelled (no timing: how soon depends on the machine's load)
        assert stream.cancelled and stream.completion is None

        stream = client.stream(PROMPTS[1], max_tokens=300)  # cancel() from another thread
        received = []
        consumer = threading.Thread(target=lambda: received.extend(stream))
        consumer.start()
        assert wait_for(lambda: len(received) >= 3, 60.0)
        stream.cancel()
        consumer.join(60)
        assert not consumer.is_alive() and stream.cancelled and stream.completion is None
        assert client.generate(PROMPTS[1], max_tokens=MAX_TOKENS).text == reference(PROMPTS[1])
    wait_until_done(server, done_before + 3)
    wait_until_idle(server)  # the abandoned generations ran to their end and freed their KV blocks


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_past_its_timeout_raises_the_timeout_error(server, protocol, never_retried):
    wait_until_idle(server)
    done_before = ensemble_requests_done(server)
    with TritonLLMClient(url_of(server, protocol), protocol, timeout=0.3, retries=3) as client:
        for call in (client.generate, lambda *a, **k: list(client.stream(*a, **k))):
            with pytest.raises(ClientTimeoutError) as raised:  # never_retried: a retry raises AssertionError instead
                call(PROMPTS[0], max_tokens=300)
            assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, ClientError)
            assert "0.3 s" in str(raised.value)
    # The gRPC deadline cancels a stream on the server; a non-streamed or HTTP request runs to its end.
    wait_until_done(server, done_before + 2)


# -- the infer command ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_command_prints_the_answer(server, reference, protocol):
    parser = add_infer_arguments(argparse.ArgumentParser())
    prompt = PROMPTS[0]
    base = [prompt, "--url", url_of(server, protocol), "--protocol", protocol, "--max-tokens", str(MAX_TOKENS)]
    out = io.StringIO()
    assert run_infer(parser.parse_args(base + ["--stream"]), out=out) == 0
    assert out.getvalue() == reference(prompt) + "\n"
    out = io.StringIO()
    assert run_infer(parser.parse_args(base + ["--json"]), out=out) == 0
    record = json.loads(out.getvalue())
    assert set(record) == {"prompt", "text", "latency_s", "protocol"}
    assert (record["prompt"], record["text"], record["protocol"]) == (prompt, reference(prompt), protocol)
    out, err = io.StringIO(), io.StringIO()
    assert run_infer(parser.parse_args(base + ["--max-tokens", "0"]), out=out, err=err) == 1
    assert out.getvalue() == ""
    assert err.getvalue() in (
        "error: in ensemble 'ensemble', max_tokens must be at least 1, got 0\n",  # gRPC: Triton's message only
        "error: [400] in ensemble 'ensemble', max_tokens must be at least 1, got 0\n",
    )


# -- priority (serve.traffic; docs/traffic-classes.md) -----------------------------------------
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_priority_reaches_the_engine_through_the_ensemble_and_the_bls(server, reference, model):
    """Both entry models take the priority and pass it on: a valid one leaves the greedy answer as it is, and one the
    engine refuses comes back naming `priority` (so it was not dropped on the way, as Triton drops its own request
    priority inside an ensemble)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    with TritonLLMClient(server.options.grpc_url, "grpc", model, timeout=60) as client:
        for priority in (0.0, 1.0):
            assert client.generate(PROMPTS[0], max_tokens=MAX_TOKENS, priority=priority).text == reference(PROMPTS[0])
    values = {"text_input": np.array([[PROMPTS[0].encode()]], dtype=object), "max_tokens": np.array([[4]], dtype=np.int32)}
    values["priority"] = np.array([[1.5]], dtype=np.float32)  # past the client's own check, as a hand-made request is
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    errors: list[str] = []
    triton = grpcclient.InferenceServerClient(server.options.grpc_url)
    try:
        triton.start_stream(callback=lambda result, error: errors.append(str(error)) if error is not None else None)
        triton.async_stream_infer(model, inputs)
        assert wait_for(lambda: bool(errors), 30), "no answer to a priority of 1.5"
    finally:
        triton.stop_stream()
        triton.close()
    assert "priority" in errors[0] and "1.5" in errors[0], errors[0]

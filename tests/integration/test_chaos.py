"""Chaos against the real tritonserver: clients that cut their streams must not hurt the server.

A fixed number of sampled streams, 8 at a time, over Triton gRPC and HTTP SSE (ensemble and BLS)
and the OpenAI front end; half of them cut after 0-10 responses (0: during the prompt's prefill).
Afterwards the server is ready, its log has no `Signal (N)`, no Python-backend stub was replaced,
KV blocks in use and active requests are back to 0, and a greedy request returns the text it
returned before. On the code before issue #11 this run killed tritonserver (SIGSEGV in
TRITONBACKEND_ResponseFactoryIsCancelled) or a stub (heap corruption) within seconds.
"""

from __future__ import annotations

import concurrent.futures
import queue
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bench.soak.bench import greedy_answer, judge, read_vitals, soak, wait_until_idle
from bench.soak.samples import SELF_NAME
from clients.load.chaos import ChaosOutcome, ChaosPlan, ChaosTargets
from clients.openai_server import running_openai_server
from tests.support.serving import infer_inputs, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny-cpu"
PROMPTS_FOR_BEAMS = ("def __init__(self", "import", "class Parser", "for line in")
PLAN = ChaosPlan(requests=160, concurrency=8, cut_fraction=0.5, max_tokens=(8, 64), cut_after=(0, 8), seed=11)


@pytest.fixture(scope="module")
def served(tiny_cpu, tmp_path_factory):
    paths = tiny_cpu
    # Exit 1 with only the ensemble and/or the BLS still loaded is Triton 2.51's race (serving.STUCK_ENSEMBLE,
    # STUCK_BLS: the gRPC and HTTP streams go to both): a warning.
    with serving_repository(paths["repository"], tmp_path_factory.mktemp("serve"), allow_stuck_ensemble=True, allow_stuck_bls=True) as server:
        with running_openai_server(server.options.grpc_url, model_name=MODEL, model_repository=paths["repository"]) as base_url:
            yield server, base_url


def test_cut_streams_on_every_endpoint_leave_the_server_as_it_was(served):
    server, base_url = served
    targets = ChaosTargets(server.options.grpc_url, server.options.http_url, base_url, MODEL)
    verdict = soak(PLAN, targets, server_pid=server.pid, metrics_url=server.options.metrics_url, log_path=server.log_path, sample_interval_s=1.0)
    assert verdict.ok, verdict.problems
    # The soak's short form: what the server's processes hold after the drain is what they held before, within a few
    # pooled connections and threads, where a leak per request would leave up to PLAN.requests of them.
    for trend in verdict.trends:
        if trend["name"] != SELF_NAME:
            assert trend["fds_last"] - trend["fds_first"] < PLAN.requests // 8, trend
            assert trend["threads_last"] - trend["threads_first"] < PLAN.requests // 8, trend
    assert len(verdict.samples) >= 3
    traffic = verdict.traffic
    assert traffic["sent"] == PLAN.requests and traffic["failed"] == 0
    for route in ("grpc:ensemble", "grpc:tensorrt_llm_bls", "http:ensemble", "http:tensorrt_llm_bls", "openai"):
        counts = traffic["by_route"][route]
        assert counts["cut"] > 0 and counts["done"] > 0, (route, counts)
    assert verdict.after["stub_pids"] == verdict.before["stub_pids"]


def _stream(grpc_url: str, model: str, prompt: str, max_tokens: int, *, request_id: str, cancel_after_final: bool = False) -> str:
    """One greedy gRPC stream read to its final response; its text. `cancel_after_final`: then
    cancel it anyway, as a client that closes its stream late does."""
    inputs = infer_inputs(
        {
            "text_input": np.array([[prompt.encode()]], dtype=np.object_),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "stream": np.array([[True]], dtype=np.bool_),
        }
    )
    client = grpcclient.InferenceServerClient(grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
    text = ""
    try:
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                raise error
            array = result.as_numpy("text_output")
            if array is not None:
                text += array.reshape(-1)[0].decode()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text
    finally:
        client.stop_stream(cancel_requests=cancel_after_final)
        client.close()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_the_same_request_id_twice_and_a_cancel_after_the_final_response(served, model):
    """Four concurrent requests under one request id each get the whole greedy answer; a
    cancellation that comes after the final response changes nothing (and the module's server
    still stops cleanly: running_server checks the exit code)."""
    server, _ = served
    url = server.options.grpc_url
    expected = _stream(url, model, "import", 16, request_id="alone")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _stream(url, model, "import", 16, request_id="same-id"), range(4)))
    assert answers == [expected] * 4
    assert _stream(url, model, "import", 16, request_id="late-cancel", cancel_after_final=True) == expected
    with urllib.request.urlopen(f"{server.options.http_url}/v2/health/ready", timeout=5) as response:
        assert response.status == 200
    assert _stream(url, model, "import", 16, request_id="after") == expected


def _beam_stream(grpc_url: str, model: str, prompt: str, max_tokens: int, beam_width: int, cut_after: int | None) -> int:
    """One streamed beam-search request over gRPC; cut (cancelled) after `cut_after` responses, else read to its
    final response. The number of responses read; every response carries one text per returned beam."""
    inputs = infer_inputs(
        {
            "text_input": np.array([[prompt.encode()]], dtype=np.object_),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "stream": np.array([[True]], dtype=np.bool_),
            "beam_width": np.array([[beam_width]], dtype=np.int32),
        }
    )
    client = grpcclient.InferenceServerClient(grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(model, inputs, request_id=f"beams-{uuid.uuid4().hex}", enable_empty_final_response=True)
    count = 0
    try:
        while cut_after is None or count < cut_after:
            result, error = responses.get(timeout=60)
            if error is not None:
                raise error
            texts = result.as_numpy("text_output")
            final = result.get_response().parameters["triton_final_response"].bool_param
            if texts is not None:
                assert texts.size == beam_width, texts
                count += 1
            if final:
                return count
        return count
    finally:
        client.stop_stream(cancel_requests=cut_after is not None)
        client.close()


def test_cut_beam_streams_leave_the_server_as_it_was(served):
    """Streamed beam search (every beam whole in each response) under the same abuse: 24 streams, 6 at a time,
    over the ensemble and the BLS, half cut after 0-5 responses; then the server is as it was."""
    server, _ = served
    vitals = lambda: read_vitals(server.pid, server.options.http_url, server.options.metrics_url, server.log_path)  # noqa: E731
    before = wait_until_idle(vitals)
    greedy_before = greedy_answer(server.options.grpc_url)
    plans = [
        (("ensemble", "tensorrt_llm_bls")[i % 2], PROMPTS_FOR_BEAMS[i % len(PROMPTS_FOR_BEAMS)], 8 + 8 * (i % 6), 2 + i % 3, (i % 6) if i % 2 else None)
        for i in range(24)
    ]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        counts = list(pool.map(lambda plan: _beam_stream(server.options.grpc_url, *plan), plans))
    for (model, _, max_tokens, _, cut_after), count in zip(plans, counts):
        assert count >= 1 if cut_after is None else count <= cut_after, (model, max_tokens, cut_after, count)
    after = wait_until_idle(vitals)
    problems = judge(ChaosOutcome(), before, after, greedy_before, greedy_answer(server.options.grpc_url))
    assert not problems, problems
    assert sum(count for (*_, cut_after), count in zip(plans, counts) if cut_after is None) > 12  # the uncut ones streamed

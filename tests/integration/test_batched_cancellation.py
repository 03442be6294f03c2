"""Streams ended early with serve.postprocessing_dynamic_batching on, in the real tritonserver 2.51 (issue #34).

The project's async client with `stop_model` (what the OpenAI front end uses on an ensemble, clients/aio_stop.py)
ends a stream by TensorRT-LLM's `stop` to `tensorrt_llm` and reads the stream to its end, never cancelling it: the
engine stops generating within a few steps, the streams beside it (streamed and not, n > 1, beams) get their own
texts, postprocessing's batcher answers no request itself, and every ensemble request ends, which the module's
server proves by exiting 0 (tritonserver waits for requests in flight and exits 1). The same through the OpenAI front
end on the ensemble (a dropped SSE stream and a stop sequence) and under churn (80 streams, half of them cut by a
stop). How a cancelled call fares instead is test_batched_postprocessing.py's last test."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from clients.aio import AsyncTritonLLMClient
from clients.load.chaos import ChaosPlan, ChaosTargets, run_chaos
from clients.openai_server import running_openai_server
from tests.support import postprocessing_batches as batches
from tests.support.serving import greedy_reference, loopback_options, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STOPPED = 4  # streams ended early at once
STOPPED_MAX_TOKENS = 400  # what each would generate if it were not stopped
STOP_AFTER = 3  # responses read before the stop
FRESH_S = 0.25  # 2.5 periods of the engine metrics' refresh (cancellation_check_period_ms)
# Tokens a stopped stream may still generate: the engine steps while the client reads its first responses and sends
# the stop (the engine runs ahead of a client that a loaded machine holds up), then until the abort (the cpu model
# aborts at its next step). How many is the machine's load, so the bound only says the generation was cut short: a
# quarter of its max_tokens, which still tells an unstopped stream apart beside the others' generous bound below.
STOPPED_TOKENS_BOUND = STOPPED_MAX_TOKENS // 4
# Through the OpenAI front end the tokens generated while it notices the drop count too (1-86 measured on this
# loaded machine): the bound only says the generation was stopped, far from its max_tokens.
FRONT_END_TOKENS_BOUND = STOPPED_MAX_TOKENS // 2


@pytest.fixture(scope="module")
def reference(tiny_cpu):
    return greedy_reference(tiny_cpu["engine"], tiny_cpu["tokenizer"], batches.MAX_TOKENS)


@pytest.fixture(scope="module")
def repository(tiny_cpu, tmp_path_factory):
    return batches.render_batched_repository(tiny_cpu, tmp_path_factory.mktemp("batched-stop") / "model_repository")


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    with running_server(loopback_options(repository), tmp_path_factory.mktemp("serve"), allow_stuck_ensemble=False) as triton:
        yield triton


async def _stop_after(client: AsyncTritonLLMClient, prompt: str, responses: int) -> float:
    """Open a stream, read `responses` deltas, end it (aclose → the client's stop); when it was ended."""
    stream = client.stream(prompt, max_tokens=STOPPED_MAX_TOKENS)
    async for _ in stream:
        responses -= 1
        if responses <= 0:
            break
    await stream.aclose()
    return time.monotonic()


def _wait_idle(metrics_url: str, timeout_s: float) -> float:
    """Seconds until the engine holds no request and no KV block (printed, not asserted: how soon is the machine's
    load). The engine's metrics are refreshed every 100 ms, so the first reading is taken FRESH_S later (one that
    may predate the stop, or the request, would say idle), and the generated-token count must then hold still over
    two reads (a refresh a loaded machine delays would otherwise pass for idle)."""
    start = time.monotonic()
    time.sleep(FRESH_S)
    batches.generated_when_idle(metrics_url, timeout_s)
    return time.monotonic() - start


def _ensemble_done(http_url: str, expected: int, timeout_s: float) -> int:
    """The ensemble's successful requests, once they reach `expected` (or `timeout_s` has passed)."""
    deadline = time.monotonic() + timeout_s
    while (done := batches.model_stats(http_url, "ensemble")[0]) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return done


def test_stopped_streams_end_in_the_engine_and_the_others_complete(server, reference, tiny_cpu):
    options = server.options
    jobs = (
        [("streamed", prompt, batches.ensemble_inputs(prompt, stream=True)) for prompt in batches.PROMPTS[:2]]
        + [("whole", batches.PROMPTS[2], batches.ensemble_inputs(batches.PROMPTS[2], stream=False))]
        + [("two samples", batches.PROMPTS[3], batches.ensemble_inputs(batches.PROMPTS[3], stream=True, num_return_sequences=2))]
        + [("beams", batches.PROMPTS[4], batches.ensemble_inputs(batches.PROMPTS[4], stream=False, max_tokens=12, beam_width=2))]
    )
    tokens_before = batches.generated_tokens(options.metrics_url)
    ensemble_before = batches.model_stats(options.http_url, "ensemble")[0]
    failed_before = batches.failed_requests(options.http_url, "postprocessing")

    async def run() -> list:
        async with AsyncTritonLLMClient(options.grpc_url, stop_model="tensorrt_llm") as client:
            others = [asyncio.to_thread(batches.streamed_texts, options.grpc_url, inputs) for _, _, inputs in jobs]
            stopped = [_stop_after(client, batches.PROMPTS[index], STOP_AFTER) for index in range(STOPPED)]
            results = await asyncio.gather(*others, *stopped)
            idle_s = await asyncio.to_thread(_wait_idle, options.metrics_url, 30)
            return [*results, idle_s]

    *answers, idle_s = asyncio.run(run())
    answers = answers[: len(jobs)]
    for (kind, prompt, _), answer in zip(jobs, answers):
        if kind == "beams":
            assert answer[0] == [batches.reference_beams(tiny_cpu, prompt, 2)]
            continue
        assert sorted(answer) == ([0, 1] if kind == "two samples" else [0]), kind
        for sequence in answer.values():
            assert "".join(texts[0] for texts in sequence) == reference(prompt), (kind, prompt)
    # Every ensemble request ended (the stopped ones with their empty final response), none failed in the batcher.
    sent = len(jobs) + STOPPED
    assert _ensemble_done(options.http_url, ensemble_before + sent, 30) == ensemble_before + sent
    assert batches.failed_requests(options.http_url, "postprocessing") == failed_before
    others_tokens = sum(len(reference(prompt)) for _, prompt, _ in jobs) * 2  # a generous bound: a token per character
    generated = batches.generated_tokens(options.metrics_url) - tokens_before
    print(f"stopped {STOPPED} streams after {STOP_AFTER} responses: engine idle {idle_s:.2f} s later, {generated} tokens generated in all")
    assert generated <= others_tokens + STOPPED * STOPPED_TOKENS_BOUND, generated


def test_a_stream_stopped_before_its_first_token_ends(server):
    """The stop comes before the request reaches tensorrt_llm (still in preprocessing, or queued): the client sends it
    again until the stream ends, so the generation is still cut short and the ensemble request ends."""
    options = server.options
    tokens_before = batches.generated_tokens(options.metrics_url)
    ensemble_before = batches.model_stats(options.http_url, "ensemble")[0]

    async def run() -> float:
        async with AsyncTritonLLMClient(options.grpc_url, stop_model="tensorrt_llm") as client:
            stream = client.stream(batches.PROMPTS[0], max_tokens=STOPPED_MAX_TOKENS)
            stream_task = asyncio.ensure_future(anext(stream, None))
            await asyncio.sleep(0.01)  # the call is open, no response yet
            stream.cancel()
            await asyncio.gather(stream_task, return_exceptions=True)
            return await asyncio.to_thread(_wait_idle, options.metrics_url, 30)

    asyncio.run(run())
    assert _ensemble_done(options.http_url, ensemble_before + 1, 30) == ensemble_before + 1
    generated = batches.generated_tokens(options.metrics_url) - tokens_before
    print(f"a stream stopped 10 ms after it was sent: {generated} tokens generated")
    assert generated <= STOPPED_TOKENS_BOUND


def test_the_openai_front_end_on_the_ensemble_stops_a_dropped_stream_and_a_stop_sequence(server, repository):
    options = server.options
    tokens_before = batches.generated_tokens(options.metrics_url)
    ensemble_before = batches.model_stats(options.http_url, "ensemble")[0]
    with (
        running_openai_server(options.grpc_url, model_name="tiny", model_repository=repository, triton_model="ensemble") as url,
        openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as oai,
    ):
        stream = oai.completions.create(model="tiny", prompt=batches.PROMPTS[0], max_tokens=STOPPED_MAX_TOKENS, temperature=0, stream=True)
        for index, _ in enumerate(stream):
            if index == STOP_AFTER:
                break
        stream.close()  # the client goes away mid-stream
        idle_s = _wait_idle(options.metrics_url, 30)
        dropped = batches.generated_tokens(options.metrics_url) - tokens_before
        first = oai.completions.create(model="tiny", prompt=batches.PROMPTS[1], max_tokens=STOPPED_MAX_TOKENS, temperature=0).choices[0].text
        stopped = oai.completions.create(model="tiny", prompt=batches.PROMPTS[1], max_tokens=STOPPED_MAX_TOKENS, temperature=0, stop=[first[2:6]])
        _wait_idle(options.metrics_url, 30)
    assert stopped.choices[0].finish_reason == "stop"
    assert _ensemble_done(options.http_url, ensemble_before + 3, 30) == ensemble_before + 3
    print(f"OpenAI front end: a stream dropped after {STOP_AFTER + 1} chunks generated {dropped} tokens, the engine idle {idle_s:.2f} s after the drop")
    assert dropped <= FRONT_END_TOKENS_BOUND


def test_churn_of_stopped_streams_leaves_nothing_behind(server):
    """Chaos traffic to the batched ensemble over gRPC, half of the streams cut (before their first response or after
    up to 10) by a stop: every stream that was not cut completes, the batcher cancels nothing, the engine is idle
    after, and (at the module's end) the server exits with no request in flight."""
    options = server.options
    failed_before = batches.failed_requests(options.http_url, "postprocessing")
    ensemble_before = batches.model_stats(options.http_url, "ensemble")[0]
    plan = ChaosPlan(requests=80, concurrency=16, endpoints=("grpc",), triton_models=("ensemble",), grpc_cut="stop", seed=34)
    outcome = asyncio.run(run_chaos(plan, ChaosTargets(options.grpc_url, options.http_url)))
    print(f"chaos: {outcome.as_dict()}")
    assert outcome.failed == 0 and outcome.cut > 0, outcome.as_dict()
    _wait_idle(options.metrics_url, 30)
    assert _ensemble_done(options.http_url, ensemble_before + plan.requests, 30) == ensemble_before + plan.requests
    assert batches.failed_requests(options.http_url, "postprocessing") == failed_before

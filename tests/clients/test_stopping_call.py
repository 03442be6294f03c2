"""StoppingGrpcCall (clients/aio_stop.py): a stream ended early by a `stop` to the LLM model, never by cancelling its
call. The ensemble call here is scripted (it ends once the stop arrives, as Triton's ensemble does when tensorrt_llm
ends the generation); tests/integration/test_batched_cancellation.py runs the same against the real tritonserver."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from clients.aio_stop import StoppingGrpcCall
from clients.aio_transport import AioGrpcCall
from clients.openai_server import ServedModel, ServerSettings, create_app
from clients.openai_server.tokenizer import PromptTokenizer
from tests.clients.test_openai_server import REPO, TOKENIZER_DIR, FakeResult

GOLDEN_REPOSITORY = REPO / "tests" / "golden" / "model_repo_tiny_cpu"


class EnsembleCall:
    """tritonclient.grpc.aio's response iterator of a streamed ensemble request: a response every 10 ms until `stopped`
    is set (or `limit` responses), then the final response and the end of the RPC."""

    def __init__(self, limit: int = 1000) -> None:
        self.stopped = asyncio.Event()
        self.sent = 0
        self.limit = limit
        self.read_to_end = self.cancelled = False
        self._ended = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._ended:
            self.read_to_end = True
            raise StopAsyncIteration
        if self.cancelled:
            raise asyncio.CancelledError
        if not self.stopped.is_set() and self.sent < self.limit:
            await asyncio.sleep(0.01)
            self.sent += 1
            return FakeResult("a", [-1.0], final=False), None
        self._ended = True
        return FakeResult("", [], final=True), None

    def cancel(self):
        self.cancelled = True


class Client:
    """The grpc.aio client: the first stream_infer is the ensemble call; later ones are stop requests, recorded and
    (from the `effective_from`-th on) applied."""

    def __init__(self, call: EnsembleCall, effective_from: int = 1) -> None:
        self.call = call
        self.stops: list[tuple[str, str, dict]] = []
        self.effective_from = effective_from

    def stream_infer(self, requests, stream_timeout=None):
        if not hasattr(self, "opened"):
            self.opened = True
            return self.call
        return self._stop(requests)

    async def _stop(self, requests):
        async for request in requests:
            values = {tensor.name(): tensor.datatype() for tensor in request["inputs"]}
            self.stops.append((request["model_name"], request["request_id"], values))
        if len(self.stops) >= self.effective_from:
            self.call.stopped.set()
        return
        yield  # an async generator that yields nothing: the stop request's stream ends with no response


async def _stopped_after(responses: int, client: Client, *, drain_s: float = 5.0):
    tasks: set[asyncio.Task] = set()
    call = StoppingGrpcCall(
        AioGrpcCall(client, "url", "ensemble", {"text_input": "x", "max_tokens": 9}, timeout=None), client, "tensorrt_llm", tasks, drain_s=drain_s
    )
    seen = 0
    async for _chunk in call.chunks():
        seen += 1
        if seen == responses:
            call.cancel()
    await asyncio.wait(set(tasks))
    return call, seen


def test_cancel_sends_stop_with_the_request_id_and_reads_the_call_to_its_end_without_cancelling_it():
    client = Client(EnsembleCall())
    call, seen = asyncio.run(_stopped_after(3, client))
    assert seen == 3  # the consumer's iteration ended at cancel()
    [(model, request_id, inputs)] = client.stops
    assert (model, request_id) == ("tensorrt_llm", call.request_id)
    assert inputs == {"stop": "BOOL", "input_lengths": "INT32", "request_output_len": "INT32"}
    assert client.call.read_to_end and not client.call.cancelled


def test_a_stop_that_finds_nothing_yet_is_sent_again_until_the_stream_ends():
    client = Client(EnsembleCall(), effective_from=3)
    asyncio.run(_stopped_after(1, client))
    assert len(client.stops) == 3 and client.call.read_to_end and not client.call.cancelled


def test_a_stream_that_does_not_end_is_cancelled_after_the_drain_time():
    client = Client(EnsembleCall(), effective_from=10**6)
    asyncio.run(_stopped_after(1, client, drain_s=0.3))
    assert client.call.cancelled and len(client.stops) >= 2


def test_cancel_from_another_thread_stops_on_the_calls_loop():
    """A stream's __del__ may run on any thread: the stop is scheduled on the loop that runs the call."""
    client = Client(EnsembleCall())

    async def scenario():
        tasks: set[asyncio.Task] = set()
        call = StoppingGrpcCall(AioGrpcCall(client, "url", "ensemble", {"text_input": "x", "max_tokens": 9}, timeout=None), client, "tensorrt_llm", tasks)
        chunks = call.chunks()
        await anext(chunks)
        await asyncio.to_thread(call.cancel)
        rest = [chunk async for chunk in chunks]
        await asyncio.wait(set(tasks))
        return call, rest

    call, rest = asyncio.run(scenario())
    assert rest == [] and [request_id for _, request_id, _ in client.stops] == [call.request_id]
    assert client.call.read_to_end and not client.call.cancelled


def test_a_finished_stream_sends_no_stop():
    client = Client(EnsembleCall(limit=2))

    async def scenario():
        tasks: set[asyncio.Task] = set()
        call = StoppingGrpcCall(AioGrpcCall(client, "url", "ensemble", {"text_input": "x", "max_tokens": 9}, timeout=None), client, "tensorrt_llm", tasks)
        finals = [chunk.final async for chunk in call.chunks()]
        call.close()  # what a stream does after its final response
        await asyncio.wait(set(tasks))
        return finals

    assert asyncio.run(scenario()) == [False, False, True]
    assert client.stops == [] and client.call.read_to_end and not client.call.cancelled


@pytest.mark.parametrize(("triton_model", "stop_model"), [("ensemble", "tensorrt_llm"), ("tensorrt_llm_bls", None)])
def test_the_openai_front_end_stops_ensemble_streams_and_leaves_the_bls_its_own_cancellation(triton_model, stop_model):
    """The BLS calls tensorrt_llm with request ids of its own (a stop by the client's id would find nothing) and polls
    its own cancellation; an ensemble passes the client's id to its steps."""
    served = ServedModel.from_repository(GOLDEN_REPOSITORY, name="tiny", triton_model=triton_model)
    app = create_app(ServerSettings("127.0.0.1:1", served), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    with TestClient(app):
        assert app.state.triton.stop_model == stop_model

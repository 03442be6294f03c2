"""The clients' pure parts, without a server: the SSE parser, Triton's error bodies, the retry
policy, the request → input mapping, and TextStream's retry / cancel rules over fake calls."""

from __future__ import annotations

import ast
import asyncio
import gc
import threading
from pathlib import Path

import pytest

from clients import ClientError, GenerationRequest, RequestError, RetryPolicy, ServerUnavailableError, TextStream
from clients.errors import ClientTimeoutError, InvalidRequestError, ProtocolError
from clients.grpc import infer_inputs
from clients.http import http_base_url
from clients.sse import SSEEvent, SSEParser, chunk_from_event, error_message
from clients.stream import AsyncTextStream
from clients.types import Chunk, chunk_from_json

CLIENTS = Path(__file__).resolve().parents[2] / "clients"


# -- SSE --------------------------------------------------------------------------------------
TRITON_STREAM = (
    b'data: {"model_name":"ensemble","text_output":" _"}\n\n'
    b'data: {"model_name":"ensemble","text_output":"get"}\n\n'
    b'data: {"model_name":"ensemble","text_output":"\xc3\xa9\xf0\x9f\x8e\x89"}\n\n'
)


def parse_in_pieces(raw: bytes, size: int) -> list[SSEEvent]:
    parser = SSEParser()
    events = []
    for start in range(0, len(raw), size):
        events += parser.feed(raw[start : start + size])
    return events + parser.close()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_events_are_the_same_however_the_bytes_are_split(size):
    """Chunk boundaries inside a line, a CRLF or a multi-byte character change nothing."""
    events = parse_in_pieces(TRITON_STREAM, size)
    texts = [chunk_from_event(event).text for event in events]
    assert texts == [" _", "get", "é🎉"]
    assert parse_in_pieces(TRITON_STREAM.replace(b"\n", b"\r\n"), size) == events
    assert parse_in_pieces(TRITON_STREAM.replace(b"\n", b"\r"), size) == events


def test_sse_fields_comments_and_multiline_data():
    raw = b": keep-alive\n\nevent: update\nid: 7\ndata: first\ndata:second\nretry: 10\nunknown: x\n\ndata\n\n"
    assert parse_in_pieces(raw, 5) == [
        SSEEvent(data="first\nsecond", event="update", id="7"),
        SSEEvent(data="", event="message", id="7"),
    ]


def test_a_last_event_without_its_blank_line_is_not_lost():
    parser = SSEParser()
    assert parser.feed(b'data: {"text_output": "a"}\n\ndata: {"text_output": "b"}') == [SSEEvent('{"text_output": "a"}')]
    assert parser.close() == [SSEEvent('{"text_output": "b"}')]


def test_a_trailing_cr_waits_for_a_possible_lf():
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n\r\n") == [SSEEvent("x")]


def test_invalid_utf8_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="not UTF-8"):
        SSEParser().feed(b"data: \xff\xfe\n\n")
    parser = SSEParser()
    parser.feed(b"data: \xc3")
    with pytest.raises(ProtocolError, match="inside a UTF-8 character"):
        parser.close()


def test_error_events_raise_request_error_with_tritons_message():
    event = SSEEvent('{"error":"in ensemble \'ensemble\', max_tokens must be at least 1, got 0"}')
    with pytest.raises(RequestError) as raised:
        chunk_from_event(event, status=400)
    assert raised.value.status == 400
    assert raised.value.message == "in ensemble 'ensemble', max_tokens must be at least 1, got 0"
    with pytest.raises(RequestError) as raised:  # an error after the 200 header: no status
        chunk_from_event(SSEEvent('{"error":"request cancelled"}'))
    assert raised.value.status is None and str(raised.value) == "request cancelled"


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '{"model_name": "ensemble"}'])
def test_events_outside_the_contract_are_protocol_errors(data):
    with pytest.raises(ProtocolError):
        chunk_from_event(SSEEvent(data))


def test_error_bodies_of_generate_and_generate_stream():
    assert error_message(b'{"error":"Request for unknown model: \'x\' is not found"}') == "Request for unknown model: 'x' is not found"
    assert error_message(b'data: {"error":"max_tokens must be at least 1, got 0"}\n\n') == "max_tokens must be at least 1, got 0"
    assert error_message(b"<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"
    assert error_message(b"") == "(empty response body)"


def test_log_probs_give_the_token_count():
    assert chunk_from_json({"text_output": "ab", "output_log_probs": [-1.0, -2.0], "cum_log_probs": -3.0}) == Chunk("ab", 2, -3.0)
    assert chunk_from_json({"text_output": "a", "output_log_probs": -1.0}).num_tokens == 1  # one value comes back as a scalar
    assert chunk_from_json({"text_output": "a"}).num_tokens is None


def test_beam_search_answers_keep_every_beam():
    chunk = chunk_from_json({"text_output": ["best", "second"], "cum_log_probs": [-1.0, -2.5]})
    assert chunk.text == "best" and chunk.beams == ("best", "second") and chunk.beam_cum_log_probs == (-1.0, -2.5)
    assert GenerationRequest("hi", 8, beam_width=2, length_penalty=0.5).inputs(stream=False)["beam_width"] == 2
    with pytest.raises(InvalidRequestError, match="beam_width 2 is not streamed as text deltas") as refused:
        GenerationRequest("hi", 8, beam_width=2).inputs(stream=True)  # the server streams them whole: not deltas
    assert refused.value.field == "beam_width"


def test_a_beam_stream_keeps_the_last_whole_beams_and_ignores_the_empty_final_response():
    from clients.record import Recorder, beam_texts

    record = Recorder("grpc", 8, whole_beams=True)
    steps = [
        Chunk(text="a", beams=("a", "b"), beam_cum_log_probs=(-1.0, -1.5)),
        Chunk(text="bc", beams=("bc", "ad"), beam_cum_log_probs=(-1.2, -1.4)),  # beam 0 now continues "b"
        Chunk(text="", final=True),
    ]  # the empty final response
    assert [beam_texts(chunk) for chunk in steps] == [("a", "b"), ("bc", "ad"), ()]
    for chunk in steps:
        record.add(chunk)
    completion = record.finish()
    assert (completion.text, completion.beams, completion.beam_cum_log_probs) == ("bc", ("bc", "ad"), (-1.2, -1.4))
    single = Recorder("http", 8, whole_beams=True)  # one beam returned: each text is the whole beam, not a delta
    for text in ("x", "xy", "xz"):
        single.add(Chunk(text=text))
    assert single.finish().text == "xz"


# -- requests ---------------------------------------------------------------------------------
def test_generation_request_sends_only_what_is_set():
    request = GenerationRequest("hi", 8, top_k=40, seed=3, stop="\n", bad_words=[" sys", " os"])
    assert request.inputs(stream=True) == {
        "text_input": "hi",
        "max_tokens": 8,
        "stop_words": ["\n"],
        "bad_words": [" sys", " os"],
        "temperature": 0.0,
        "top_k": 40,
        "seed": 3,
        "stream": True,
    }
    assert GenerationRequest("hi", 8, temperature=None).inputs(stream=False) == {"text_input": "hi", "max_tokens": 8, "stream": False}
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        GenerationRequest("hi", 8, temprature=1.0)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        GenerationRequest("hi", "8")
    with pytest.raises(TypeError, match="stop must be a string or a sequence of strings"):
        GenerationRequest("hi", 8, stop=[1]).inputs(stream=False)


def test_grpc_inputs_have_the_ensembles_datatypes_and_shapes():
    request = GenerationRequest("hé", 8, top_p=0.5, seed=2**63, stop=["a", "b"], return_log_probs=True)
    tensors = {t.name(): t for t in infer_inputs(request.inputs(stream=True))}
    assert {name: (t.datatype(), t.shape()) for name, t in tensors.items()} == {
        "text_input": ("BYTES", [1, 1]),
        "max_tokens": ("INT32", [1, 1]),
        "stop_words": ("BYTES", [1, 2]),
        "temperature": ("FP32", [1, 1]),
        "top_p": ("FP32", [1, 1]),
        "seed": ("UINT64", [1, 1]),
        "return_log_probs": ("BOOL", [1, 1]),
        "stream": ("BOOL", [1, 1]),
    }


def test_urls():
    assert http_base_url("localhost:8000") == "http://localhost:8000"
    assert http_base_url("https://h:1/") == "https://h:1"


# -- retry policy -----------------------------------------------------------------------------
def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(retries=5, backoff_s=0.1, multiplier=2.0, max_backoff_s=0.5)
    assert [policy.delay(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def test_connection_errors_are_retried_then_raised_with_the_attempt_count():
    sleeps: list[float] = []
    calls = []

    def attempt():
        calls.append(1)
        raise ServerUnavailableError("h:1", "Connection refused")

    with pytest.raises(ServerUnavailableError) as raised:
        RetryPolicy(retries=2, backoff_s=0.1).call(attempt, sleep=sleeps.append)
    assert len(calls) == 3 and sleeps == pytest.approx([0.1, 0.2])
    assert raised.value.attempts == 3 and "(3 attempts): Connection refused" in str(raised.value)
    assert isinstance(raised.value, ConnectionError)


def test_a_connection_that_comes_back_succeeds():
    outcomes = iter([ServerUnavailableError("h:1", "refused"), "answer"])

    def attempt():
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert RetryPolicy(retries=1, backoff_s=0).call(attempt, sleep=lambda s: None) == "answer"


@pytest.mark.parametrize("error", [RequestError(400, "max_tokens must be at least 1"), ClientTimeoutError(1.0), ProtocolError("x")])
def test_answered_requests_and_timeouts_are_never_retried(error):
    calls = []

    def attempt():
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        RetryPolicy(retries=3, backoff_s=0).call(attempt, sleep=lambda s: None)
    assert len(calls) == 1


def test_async_retries():
    calls = []

    async def attempt():
        calls.append(1)
        raise ServerUnavailableError("h:1", "refused")

    with pytest.raises(ServerUnavailableError, match="2 attempts"):
        asyncio.run(RetryPolicy(retries=1, backoff_s=0.001).acall(attempt))
    assert len(calls) == 2


def test_timeout_error_is_a_client_error_and_a_timeout_error():
    error = ClientTimeoutError(0.5, "Deadline Exceeded")
    assert isinstance(error, ClientError) and isinstance(error, TimeoutError)
    assert str(error) == "no complete answer within 0.5 s: Deadline Exceeded"


# -- TextStream over fake calls ---------------------------------------------------------------
class FakeCall:
    def __init__(self, chunks, *, fail_after: int | None = None, error: Exception | None = None, block: threading.Event | None = None):
        self._chunks = chunks
        self._fail_after = fail_after
        self._error = error
        self._block = block
        self.cancelled = threading.Event()
        self.closed = False

    def chunks(self):
        for index, chunk in enumerate(self._chunks):
            if self._fail_after == index:
                raise self._error
            if self._block is not None and index > 0:
                self.cancelled.wait(5)
                if self.cancelled.is_set():
                    return
            yield chunk

    def cancel(self):
        self.cancelled.set()

    def close(self):
        self.closed = True


CHUNKS = [Chunk("a", 1), Chunk("b", 1), Chunk("c", 1, -1.5, final=True)]


def test_stream_assembles_the_completion():
    call = FakeCall(CHUNKS)
    stream = TextStream(lambda: call, RetryPolicy(retries=0), protocol="grpc", max_tokens=3)
    assert list(stream) == ["a", "b", "c"]
    completion = stream.completion
    assert (completion.text, completion.num_tokens, completion.cum_log_prob, completion.finish_reason) == ("abc", 3, -1.5, "length")
    assert completion.num_responses == 3 and completion.protocol == "grpc"
    assert call.closed and not call.cancelled.is_set()


def test_stream_retries_only_before_the_first_response():
    opened = []

    def open_call():
        opened.append(1)
        if len(opened) == 1:
            return FakeCall(CHUNKS, fail_after=0, error=ServerUnavailableError("h:1", "refused"))
        return FakeCall(CHUNKS, fail_after=1, error=ServerUnavailableError("h:1", "connection reset"))

    stream = TextStream(open_call, RetryPolicy(retries=5, backoff_s=0), protocol="http", max_tokens=3)
    assert next(stream) == "a"  # the second attempt answered
    with pytest.raises(ServerUnavailableError, match="connection reset"):  # later failures are not retried
        next(stream)
    assert len(opened) == 2


def test_break_cancels_the_call():
    call = FakeCall(CHUNKS)
    stream = TextStream(lambda: call, RetryPolicy(), protocol="grpc", max_tokens=3)
    for _ in stream:
        break
    stream.close()
    assert call.cancelled.is_set() and stream.completion is None and stream.cancelled


def test_a_stream_dropped_after_break_cancels_at_once_without_the_garbage_collector():
    call = FakeCall(CHUNKS)
    gc.disable()
    try:
        for _ in TextStream(lambda: call, RetryPolicy(), protocol="grpc", max_tokens=3):
            break
        assert call.cancelled.is_set()  # freed by reference counting: no cycle through the generator
    finally:
        gc.enable()


def test_cancel_from_another_thread_ends_the_iteration_quietly():
    call = FakeCall(CHUNKS, block=threading.Event())
    stream = TextStream(lambda: call, RetryPolicy(), protocol="grpc", max_tokens=3)
    assert next(stream) == "a"
    threading.Timer(0.05, stream.cancel).start()
    assert list(stream) == []
    assert stream.cancelled and call.cancelled.is_set()


def test_async_stream_cancels_on_aclose():
    class AsyncFakeCall(FakeCall):
        async def chunks(self):  # type: ignore[override]
            for chunk in self._chunks:
                yield chunk

    call = AsyncFakeCall(CHUNKS)

    async def open_call():
        return call

    async def main():
        async with AsyncTextStream(open_call, RetryPolicy(), protocol="grpc", max_tokens=3) as stream:
            async for delta in stream:
                assert delta == "a"
                break
        return stream

    stream = asyncio.run(main())
    assert call.cancelled.is_set() and stream.completion is None


# -- the package boundary ---------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(CLIENTS.glob("*.py")), ids=lambda p: p.name)
def test_clients_never_import_pipeline_or_refengine(path):
    """docs/architecture.md#layers: clients depend only on the served contract."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {name for name in imported if name.split(".")[0] in ("pipeline", "refengine")}
    assert len(path.read_text().splitlines()) < 300


def test_cli_reports_an_unreachable_server_in_one_line(capsys):
    from clients.cli import infer_main

    assert infer_main(["hi", "--url", "127.0.0.1:1", "--protocol", "http", "--retries", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach Triton at http://127.0.0.1:1 (1 attempt)")
    assert "hint: is the server running?" in err


def test_infer_beam_width_prints_every_beam(monkeypatch):
    import argparse
    import io

    import clients.client
    from clients.cli import add_infer_arguments, run_infer
    from clients.types import Completion

    sent = {}

    class FakeClient:
        def __init__(self, *args, **kwargs): ...
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def generate(self, prompt, **options):
            sent.update(options)
            return Completion("best", 0.1, beams=("best", "second"))

    monkeypatch.setattr(clients.client, "TritonLLMClient", FakeClient)
    args = add_infer_arguments(argparse.ArgumentParser()).parse_args(["def f(", "--beam-width", "2"])
    out = io.StringIO()
    assert run_infer(args, out=out, err=io.StringIO()) == 0
    assert sent["beam_width"] == 2 and out.getvalue() == "[beam 0] best\n[beam 1] second\n"

"""The clients' HTTP side against a small local stand-in for Triton's generate endpoints.

- Every connection is closed by `close()`, also while a finished stream object is still referenced
  (urllib3 2's `Session.close()` alone only forgets its pools: tritonserver then waits its exit
  timeout for the idle keep-alive connection and exits 1), after a `break` out of a stream, after
  an error in the middle of a stream, and for a stream still open when the client is closed.
- Values Triton cannot refuse properly (a JSON value of the wrong type gets HTTP 500; an integer
  beyond INT32 is wrapped) are refused before anything is sent, naming the field.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from clients import AsyncTritonLLMClient, ClientError, GenerationRequest, InvalidRequestError, ProtocolError, TritonLLMClient
from clients.grpc import infer_inputs
from clients.http import HttpCall
from clients.types import check_input

WORDS = ["def", " f", "(", "x", ")", ":"]


class FakeTriton(ThreadingHTTPServer):
    """generate (JSON), generate_stream (chunked SSE, one event per word, `max_tokens` events), ready.
    Counts the connections it holds open and the generate requests it received."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.open_connections = 0
        self.requests: list[dict] = []
        self.event_delay_s = 0.0
        self.broken_event_at: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_until_no_connection(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.open_connections == 0:
                    return True
            time.sleep(0.02)
        return False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Triton
    server: FakeTriton

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.open_connections += 1

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.lock:
                self.server.open_connections -= 1

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._send(200, b"", "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append(body)
        if body.get("max_tokens", 1) < 1:
            self._send(400, json.dumps({"error": f"max_tokens must be at least 1, got {body['max_tokens']}"}).encode())
        elif self.path.endswith("/generate"):
            self._send(200, json.dumps({"text_output": "".join(WORDS[: body["max_tokens"]])}).encode())
        else:
            self._stream(body["max_tokens"])

    def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, count: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for index in range(count):
                if index == self.server.broken_event_at:
                    event = b"data: {not json}\n\n"
                else:
                    event = f"data: {json.dumps({'text_output': WORDS[index % len(WORDS)]})}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(self.server.event_delay_s)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


@pytest.fixture
def triton():
    server = FakeTriton()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# -- connections ------------------------------------------------------------------------------
def test_close_closes_the_keep_alive_connection_of_a_finished_stream_still_referenced(triton):
    client = TritonLLMClient(triton.url, "http")
    stream = client.stream("x", max_tokens=4)
    assert "".join(stream) == "def f(x"
    assert client.generate("x", max_tokens=2).text == "def f"
    assert client.is_ready()
    assert triton.open_connections == 1  # one pooled keep-alive connection, reused
    client.close()
    assert triton.wait_until_no_connection(), "a connection outlived TritonLLMClient.close()"
    assert stream.completion.text == "def f(x"  # the stream object is still alive here


def test_close_cancels_a_stream_left_open(triton):
    triton.event_delay_s = 0.05
    client = TritonLLMClient(triton.url, "http")
    stream = client.stream("x", max_tokens=200)
    assert next(stream) == "def"
    client.close()
    assert triton.wait_until_no_connection()
    assert list(stream) == [] and stream.cancelled and stream.completion is None
    with pytest.raises(ClientError, match="the client is closed"):
        client.generate("x", max_tokens=2)
    assert not client.is_ready()


def test_breaking_out_of_a_stream_closes_its_connection_at_once(triton):
    triton.event_delay_s = 0.05
    with TritonLLMClient(triton.url, "http") as client:
        for index, _ in enumerate(client.stream("x", max_tokens=200)):
            if index == 2:
                break
        assert triton.wait_until_no_connection(), "the dropped stream kept its connection"
        assert client.generate("x", max_tokens=1).text == "def"  # the client still works


def test_an_error_in_the_middle_of_a_stream_closes_its_connection(triton):
    triton.broken_event_at = 2
    triton.event_delay_s = 0.05
    with TritonLLMClient(triton.url, "http") as client:
        received = []
        with pytest.raises(ProtocolError, match="event data is not JSON"):
            for delta in client.stream("x", max_tokens=200):
                received.append(delta)
        assert received == ["def", " f"]
        assert triton.wait_until_no_connection(), "the failed stream kept its connection"


def test_a_refused_request_leaves_no_connection_after_close(triton):
    with TritonLLMClient(triton.url, "http") as client:
        with pytest.raises(ClientError, match="max_tokens must be at least 1, got 0"):
            "".join(client.stream("x", max_tokens=0))
    assert triton.wait_until_no_connection()


def test_async_client_close_closes_every_connection(triton):
    triton.event_delay_s = 0.02

    async def main():
        client = AsyncTritonLLMClient(triton.url, "http")
        whole = "".join([delta async for delta in client.stream("x", max_tokens=4)])
        left_open = client.stream("x", max_tokens=200)
        first = await left_open.__anext__()
        await client.close()
        return whole, first, left_open

    whole, first, left_open = asyncio.run(main())
    assert (whole, first) == ("def f(x", "def")
    assert left_open.cancelled and left_open.completion is None
    assert triton.wait_until_no_connection()


# -- values refused before sending ------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"max_tokens": "abc"}, "max_tokens", "max_tokens must be an integer, got str 'abc'"),
        ({"max_tokens": "8"}, "max_tokens", "max_tokens must be an integer, got str '8'"),
        ({"max_tokens": 4.5}, "max_tokens", "max_tokens must be an integer, got float 4.5"),
        ({"max_tokens": True}, "max_tokens", "max_tokens must be an integer, got bool True"),
        ({"max_tokens": 2**32 + 5}, "max_tokens", "max_tokens 4294967301 is out of range: the input is INT32"),
        ({"temperature": "hot"}, "temperature", "temperature must be a number, got str 'hot'"),
        ({"top_p": float("nan")}, "top_p", "top_p must be a finite number, got nan"),
        ({"repetition_penalty": 1e39}, "repetition_penalty", "repetition_penalty 1e+39 is out of range: the input is FP32"),
        ({"top_k": 1.5}, "top_k", "top_k must be an integer, got float 1.5"),
        ({"seed": -1}, "seed", "seed -1 is out of range: the input is UINT64"),
        ({"exclude_input_in_output": "yes"}, "exclude_input_in_output", "exclude_input_in_output must be true or false, got str 'yes'"),
        ({"return_log_probs": 1}, "return_log_probs", "return_log_probs must be true or false, got int 1"),
        ({"stop": [1]}, "stop", "stop must be a string or a sequence of strings, got list [1]"),
        ({"prompt": b"x"}, "prompt", "prompt must be a string, got bytes b'x'"),
    ],
)
def test_invalid_values_are_refused_naming_the_field(fields, field, message):
    arguments = {"prompt": "x", "max_tokens": 4} | fields
    with pytest.raises(InvalidRequestError) as raised:
        GenerationRequest(arguments.pop("prompt"), arguments.pop("max_tokens"), **arguments)
    assert raised.value.field == field and str(raised.value).startswith(message)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError) and isinstance(raised.value, ClientError)


def test_the_clients_refuse_before_sending(triton):
    for protocol in ("http", "grpc"):
        with TritonLLMClient(triton.url if protocol == "http" else "127.0.0.1:1", protocol) as client:
            with pytest.raises(InvalidRequestError, match="max_tokens must be an integer"):
                client.generate("x", max_tokens="abc")
            with pytest.raises(InvalidRequestError, match="max_tokens 2147483648 is out of range"):
                client.stream("x", max_tokens=2**31)
    # The transport checks values that did not come from a GenerationRequest, before connecting.
    import requests

    with requests.Session() as session:
        with pytest.raises(InvalidRequestError, match="max_tokens must be an integer, got str 'abc'"):
            HttpCall(session, triton.url, "ensemble", {"text_input": "x", "max_tokens": "abc"}, timeout=5)
        with pytest.raises(InvalidRequestError, match="unknown input 'max_token'"):
            HttpCall(session, triton.url, "ensemble", {"text_input": "x", "max_token": 4}, timeout=5)
    with pytest.raises(InvalidRequestError, match="temperature must be a number"):
        infer_inputs({"text_input": "x", "max_tokens": 4, "temperature": "hot"})
    assert triton.requests == []


def test_numpy_and_boundary_values_are_sent_as_plain_json_numbers():
    request = GenerationRequest("x", np.int64(5), top_k=np.int32(3), temperature=np.float32(0.5), seed=2**64 - 1)
    values = request.inputs(stream=False)
    assert values["max_tokens"] == 5 and type(values["max_tokens"]) is int
    assert type(values["top_k"]) is int and type(values["temperature"]) is float
    json.dumps(values)  # serialisable as it is
    assert check_input("max_tokens", 2**31 - 1) == 2**31 - 1
    assert check_input("stop_words", ["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidRequestError, match="non-empty list of strings"):
        check_input("stop_words", [])

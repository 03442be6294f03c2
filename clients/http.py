"""HTTP transport: Triton's generate extension (`/v2/models/<model>/generate` and `/generate_stream`).

`/infer` is refused for the decoupled ensemble, so non-streamed requests use `generate` (one
JSON answer) and streamed ones `generate_stream` (server-sent events, `data: {json}`; an error is
an event `{"error": ...}`, with a 4xx status when it comes first). `timeout` bounds the whole
request: no single read waits longer, and the deadline is checked between reads.
Cancelling closes the connection, which ends the client's side at once; Triton 2.51 does not
cancel a request when an HTTP client goes away (only gRPC cancellation reaches the model), so the
server finishes generating on its own.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import requests
import urllib3

from clients.errors import ClientError, ClientTimeoutError, InvalidRequestError, RequestError, ServerUnavailableError
from clients.sse import SSEParser, chunk_from_event, error_message
from clients.types import Chunk, check_inputs, chunk_from_json, json_object

CONNECT_TIMEOUT_S = 10.0


def http_base_url(url: str) -> str:
    """http://host:port (http:// is added when no scheme is given)."""
    url = url.rstrip("/")
    return url if url.startswith(("http://", "https://")) else f"http://{url}"


def generate_url(base_url: str, model: str, *, stream: bool) -> str:
    return f"{base_url}/v2/models/{model}/{'generate_stream' if stream else 'generate'}"


class HttpCall:
    """One POST to generate or generate_stream. The values are checked first (InvalidRequestError):
    Triton answers a JSON value of the wrong type with HTTP 500 and wraps out-of-range integers."""

    def __init__(self, session: requests.Session, base_url: str, model: str, values: Mapping[str, Any], *, timeout: float | None) -> None:
        values = check_inputs(values)
        self._stream = bool(values.get("stream"))
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._lock = threading.Lock()
        self._closed = False
        url = generate_url(base_url, model, stream=self._stream)
        try:
            self._response = session.post(
                url,
                data=json_body(values),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream" if self._stream else "application/json"},
                stream=True,
                timeout=(min(CONNECT_TIMEOUT_S, timeout or CONNECT_TIMEOUT_S), timeout),
            )
        except requests.ConnectionError as error:  # refused, unreachable, or a connect timeout
            raise ServerUnavailableError(base_url, _reason(error)) from None
        except requests.Timeout:  # connected, but no answer in time
            raise ClientTimeoutError(timeout or 0.0, "no answer from the server") from None
        if self._response.status_code >= 400:
            try:
                body = self._response.content
            except requests.RequestException:
                body = b""
            finally:
                self.close()
            raise RequestError(self._response.status_code, error_message(body))

    def chunks(self) -> Iterator[Chunk]:
        status = self._response.status_code
        try:
            if not self._stream:
                yield chunk_from_json(json_object(self._read_all()), status=status, final=True)
                return
            parser = SSEParser()
            for raw in self._response.iter_content(chunk_size=None):
                for event in parser.feed(raw):
                    yield chunk_from_event(event, status=status)
                self._check_deadline()
            for event in parser.close():
                yield chunk_from_event(event, status=status)
        except ClientError:
            raise
        except Exception as error:  # noqa: BLE001 - urllib3 may raise anything once cancel() closed the socket
            if self._closed:
                return  # cancel() closed the connection under the reader
            if not isinstance(error, requests.RequestException):
                raise
            if _is_read_timeout(error):
                raise ClientTimeoutError(self._timeout or 0.0, "the server stopped answering") from None
            raise ServerUnavailableError(self._response.url, f"the connection broke: {_reason(error)}") from None
        finally:
            self.close()

    def cancel(self) -> None:
        """Close the connection (from any thread: a blocked read is woken by the socket shutdown)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        sock = _socket_of(self._response)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._response.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._response.close()

    def _read_all(self) -> bytes:
        parts = []
        for raw in self._response.iter_content(chunk_size=65536):
            parts.append(raw)
            self._check_deadline()
        return b"".join(parts)

    def _check_deadline(self) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise ClientTimeoutError(self._timeout or 0.0)


def json_body(values: Mapping[str, Any]) -> bytes:
    """The generate request's JSON body: arrays (lora_weights / lora_config) as nested lists. Triton's generate endpoint
    takes no 16-bit floats in JSON ("receiving FP16 data via JSON is not supported"): such weights are refused here."""
    weights = values.get("lora_weights")
    if weights is not None and weights.dtype.itemsize == 2:
        raise InvalidRequestError(
            "lora_weights",
            f"lora_weights: Triton's HTTP generate endpoint takes no {weights.dtype} values in JSON: send the "
            "adapter's first request over gRPC (protocol grpc); later requests may use HTTP with its task id alone",
        )
    return json.dumps({name: _json_value(value) for name, value in values.items()}).encode("utf-8")


def _json_value(value: Any) -> Any:
    """A value as JSON takes it: arrays (lora_weights / lora_config) as nested lists."""
    return value.tolist() if hasattr(value, "tolist") else value


def _socket_of(response: requests.Response) -> socket.socket | None:
    connection = getattr(response.raw, "_connection", None) or getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _is_read_timeout(error: BaseException) -> bool:
    """requests raises a read timeout inside a body as ConnectionError(ReadTimeoutError)."""
    if isinstance(error, requests.Timeout):
        return True
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in getattr(error, "args", ()))


def _reason(error: BaseException) -> str:
    """The innermost cause of a requests/urllib3 error, e.g. 'Connection refused'."""
    while error.__context__ is not None and isinstance(error.__context__, Exception):
        error = error.__context__
    text = str(error)
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text or type(error).__name__

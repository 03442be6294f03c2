"""asyncio transports: gRPC with `tritonclient.grpc.aio`, HTTP with aiohttp (a tritonclient[http] dependency).

gRPC: one ModelStreamInfer call per request; the request iterator yields the one request and
half-closes, so the call ends after the request's final response (and is read to that end).
Cancelling is the call's `cancel()`, which Triton turns into cancelling the request (the model
frees its KV blocks).
HTTP: as the sync transport (generate / generate_stream); closing the response ends the client's
side only (Triton 2.51 has no HTTP cancellation).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import grpc
import tritonclient.grpc.aio as grpcaio

from clients.errors import ClientError, ClientTimeoutError, RequestError, ServerUnavailableError
from clients.grpc import chunk_from_result, grpc_error, infer_inputs
from clients.http import CONNECT_TIMEOUT_S, generate_url, json_body
from clients.sse import SSEParser, chunk_from_event, error_message
from clients.types import Chunk, check_inputs, chunk_from_json, json_object


def rpc_error(error: grpc.RpcError, *, url: str, timeout: float | None) -> ClientError:
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServerUnavailableError(url, details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClientTimeoutError(timeout or 0.0, details)
    return RequestError(code.name if code is not None else None, details)


class AioGrpcCall:
    """One streamed request. `values`: the ensemble's inputs by name; or `inputs` (tensors) and
    `outputs` (requested outputs) for any other model, whose results `parse` turns into chunks
    (anything with a `final` flag)."""

    def __init__(
        self,
        client: grpcaio.InferenceServerClient,
        url: str,
        model: str,
        values: Mapping[str, Any] | None = None,
        *,
        timeout: float | None,
        inputs: list[Any] | None = None,
        outputs: list[Any] | None = None,
        parse: Callable[[Any], Any] = chunk_from_result,
    ) -> None:
        self.request_id = uuid.uuid4().hex
        self._url = url
        self._timeout = timeout
        self._cancelled = False
        self._final = False  # the final response arrived: the call ends by itself, never cancel it then
        self._parse = parse
        request: dict[str, Any] = {"model_name": model, "inputs": inputs if inputs is not None else infer_inputs(values or {}), "request_id": self.request_id}
        if outputs:
            request["outputs"] = outputs

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        self._call = client.stream_infer(one_request(), stream_timeout=timeout)

    async def chunks(self) -> AsyncIterator[Any]:
        try:
            async for result, error in self._call:
                if error is not None:
                    raise grpc_error(error, url=self._url, timeout=self._timeout)
                chunk = self._parse(result)
                self._final = chunk.final
                yield chunk
                if chunk.final:
                    break
            # Read the call to its end. A call cancelled between its final response and its end leaves
            # Triton 2.51's ensemble unable to unload (the server then waits its whole exit timeout at
            # shutdown and exits 1), so once the final response is here, cancel() and close() leave it be.
            async for _ in self._call:
                pass
        except grpc.RpcError as error:
            if self._cancelled:
                return
            raise rpc_error(error, url=self._url, timeout=self._timeout) from None
        except asyncio.CancelledError:
            if self._cancelled and not _task_cancelling():
                return  # our cancel(), not the task's
            raise

    def cancel(self) -> None:
        self._cancelled = True
        if not self._final:
            self._call.cancel()

    def close(self) -> None:
        if not self._final:
            self._call.cancel()  # a no-op once the call has ended


def _task_cancelling() -> bool:
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11+
    return bool(cancelling and cancelling())


class AioHttpCall:
    def __init__(self, response: aiohttp.ClientResponse, *, stream: bool, timeout: float | None) -> None:
        self._response = response
        self._stream = stream
        self._timeout = timeout
        self._cancelled = False

    @classmethod
    async def open(cls, session: aiohttp.ClientSession, base_url: str, model: str, values: Mapping[str, Any], *, timeout: float | None) -> AioHttpCall:
        values = check_inputs(values)  # as HttpCall: Triton's JSON conversion answers a wrong type with 500
        stream = bool(values.get("stream"))
        try:
            response = await session.post(
                generate_url(base_url, model, stream=stream),
                data=json_body(values),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout, connect=min(CONNECT_TIMEOUT_S, timeout or CONNECT_TIMEOUT_S)),
            )
        except aiohttp.ClientConnectorError as error:
            raise ServerUnavailableError(base_url, str(error.os_error) if error.os_error else str(error)) from None
        except asyncio.TimeoutError:
            raise ClientTimeoutError(timeout or 0.0, "no answer from the server") from None
        if response.status >= 400:
            try:
                body = await response.read()
            finally:
                response.release()
            raise RequestError(response.status, error_message(body))
        return cls(response, stream=stream, timeout=timeout)

    async def chunks(self) -> AsyncIterator[Chunk]:
        status = self._response.status
        try:
            if not self._stream:
                payload = json_object(await self._response.read())
                yield chunk_from_json(payload, status=status, final=True)
                return
            parser = SSEParser()
            async for raw in self._response.content.iter_any():
                for event in parser.feed(raw):
                    yield chunk_from_event(event, status=status)
            for event in parser.close():
                yield chunk_from_event(event, status=status)
        except asyncio.TimeoutError:
            raise ClientTimeoutError(self._timeout or 0.0, "the server stopped answering") from None
        except aiohttp.ClientError as error:
            if self._cancelled:
                return
            raise ServerUnavailableError(str(self._response.url), f"the connection broke: {error}") from None
        finally:
            self._response.release()

    def cancel(self) -> None:
        self._cancelled = True
        self._response.close()

    def close(self) -> None:
        self._response.release()

"""gRPC transport: one bidirectional ModelStreamInfer stream per request (tritonclient.grpc).

The ensemble is decoupled, so unary ModelInfer is refused; a non-streamed request goes over the
stream with `stream` false and gets one final response. Each request carries its own id, the
end is `triton_final_response` (with `enable_empty_final_response`, so an empty final response
still ends it). Cancelling closes the stream with `stop_stream(cancel_requests=True)`: Triton
cancels the request and the model frees its KV blocks. The deadline (`timeout`) is the stream's
gRPC deadline, which cancels the request on the server as well.

Observed with Triton 2.51: the cancellation of a *non-streamed* ensemble request (stream false)
does not reach the LLM model, which runs it to its end; streamed requests stop at once.
"""

from __future__ import annotations

import queue
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from clients.errors import ClientError, ClientTimeoutError, RequestError, ServerUnavailableError
from clients.types import ARRAY_INPUTS, INPUT_DATATYPES, TEXT_OUTPUT, Chunk, check_inputs

_NUMPY_TYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}
_GRACE_S = 5.0  # wait this long past the deadline for gRPC's own DEADLINE_EXCEEDED

# Streams still open. tritonclient reads each stream in a non-daemon thread that lives until the
# stream is stopped, so one never closed (a suspended iterator kept in a global) would hang the
# interpreter's exit; they are cancelled when threading shuts down, before it joins threads.
_OPEN_CALLS: weakref.WeakSet[GrpcCall] = weakref.WeakSet()


def _cancel_open_calls() -> None:
    for call in list(_OPEN_CALLS):
        call.cancel()


_register_before_thread_join = getattr(threading, "_register_atexit", None)  # what concurrent.futures uses
if _register_before_thread_join is not None:
    _register_before_thread_join(_cancel_open_calls)


def grpc_target(url: str) -> str:
    """host:port for tritonclient (a scheme, if given, is dropped)."""
    for scheme in ("grpc://", "http://", "dns:///"):
        url = url.removeprefix(scheme)
    return url.rstrip("/")


def infer_inputs(values: Mapping[str, Any], input_class: Any = grpcclient.InferInput) -> list[Any]:
    """The ensemble's inputs as [1, 1] (scalars) or [1, n] (word lists) tensors (values checked first)."""
    tensors = []
    for name, value in check_inputs(values).items():
        if name in ARRAY_INPUTS:  # lora_weights / lora_config: as NVIDIA's client sends them, typed by their numpy dtype
            tensor = input_class(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
            continue
        datatype = INPUT_DATATYPES[name]
        row = [item.encode("utf-8") for item in value] if isinstance(value, list) else [value.encode("utf-8") if isinstance(value, str) else value]
        array = np.array([row], dtype=_NUMPY_TYPES[datatype])
        tensor = input_class(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def grpc_error(error: InferenceServerException, *, url: str, timeout: float | None) -> ClientError:
    """tritonclient's exception → ours. In-stream model errors have no status, only Triton's message."""
    status = (error.status() or "").removeprefix("StatusCode.")
    message = error.message() or str(error)
    if status == "UNAVAILABLE":
        return ServerUnavailableError(url, message)
    if status == "DEADLINE_EXCEEDED":
        return ClientTimeoutError(timeout or 0.0, message)
    return RequestError(status or None, message)


def chunk_from_result(result: Any) -> Chunk:
    """An InferResult → a Chunk (the empty final response has no tensors: empty text)."""
    response = result.get_response()
    final = response.parameters["triton_final_response"].bool_param if "triton_final_response" in response.parameters else False
    text_array = result.as_numpy(TEXT_OUTPUT)
    parts = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in text_array.reshape(-1)] if text_array is not None else []
    log_probs = result.as_numpy("output_log_probs")
    cum = result.as_numpy("cum_log_probs")
    if len(parts) > 1:  # beam search: one text per beam, best first
        cums = tuple(float(value) for value in cum.reshape(-1)) if cum is not None else ()
        return Chunk(text=parts[0], cum_log_prob=cums[0] if cums else None, final=final, beams=tuple(parts), beam_cum_log_probs=cums)
    text = "".join(parts)
    return Chunk(
        text=text,
        num_tokens=int(log_probs.size) if log_probs is not None else (0 if text_array is None and final else None),
        cum_log_prob=float(cum.reshape(-1)[-1]) if cum is not None and cum.size else None,
        final=final,
        log_probs=tuple(float(value) for value in log_probs.reshape(-1)) if log_probs is not None else None,
    )


class ClientPool:
    """Idle tritonclient clients (each holds one channel and runs one stream at a time)."""

    def __init__(self, url: str, channel_args: list[tuple[str, Any]] | None = None) -> None:
        self.url = url
        self._channel_args = channel_args
        self._idle: list[grpcclient.InferenceServerClient] = []
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self) -> grpcclient.InferenceServerClient:
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self._idle:
                return self._idle.pop()
        return grpcclient.InferenceServerClient(self.url, channel_args=self._channel_args)

    def release(self, client: grpcclient.InferenceServerClient, *, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(client)
                return
        client.close()

    def close(self) -> None:
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for client in idle:
            client.close()


class GrpcCall:
    """One request on its own stream."""

    def __init__(self, pool: ClientPool, model: str, values: Mapping[str, Any], *, timeout: float | None) -> None:
        self.request_id = uuid.uuid4().hex
        self._pool = pool
        self._timeout = timeout
        self._responses: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self._lock = threading.Lock()
        inputs = infer_inputs(values)
        self._client: grpcclient.InferenceServerClient | None = pool.acquire()
        self._healthy = True
        _OPEN_CALLS.add(self)
        try:
            self._client.start_stream(callback=self._on_response, stream_timeout=timeout)
        except InferenceServerException as error:
            self._healthy = False
            self._stop(cancel_requests=True)
            raise grpc_error(error, url=pool.url, timeout=timeout) from None
        try:
            self._client.async_stream_infer(model, inputs, request_id=self.request_id, enable_empty_final_response=True)
        except InferenceServerException:
            # The stream already failed (e.g. connection refused): its callback has the real error.
            pass

    def _on_response(self, result: Any, error: InferenceServerException | None) -> None:
        self._responses.put((result, error))

    def chunks(self) -> Iterator[Chunk]:
        wait = None if self._timeout is None else self._timeout + _GRACE_S
        while True:
            try:
                result, error = self._responses.get(timeout=wait)
            except queue.Empty:
                self._healthy = False
                raise ClientTimeoutError(self._timeout or 0.0, "no response from the gRPC stream") from None
            if result is None and error is None:  # cancel() woke us
                return
            if error is not None:
                mapped = grpc_error(error, url=self._pool.url, timeout=self._timeout)
                self._healthy = not isinstance(mapped, (ServerUnavailableError, ClientTimeoutError))
                raise mapped
            if result.get_response().id not in ("", self.request_id):
                continue  # not ours (cannot happen on a stream of one request)
            chunk = chunk_from_result(result)
            yield chunk
            if chunk.final:
                return

    def cancel(self) -> None:
        self._stop(cancel_requests=True)
        self._responses.put((None, None))

    def close(self) -> None:
        self._stop(cancel_requests=not self._healthy)

    def _stop(self, *, cancel_requests: bool) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is None:
            return
        _OPEN_CALLS.discard(self)
        try:
            client.stop_stream(cancel_requests=cancel_requests)
        finally:
            self._pool.release(client, healthy=self._healthy)

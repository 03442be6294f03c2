"""`StoppingGrpcCall`: an ensemble stream ended early by TensorRT-LLM's `stop`, never by cancelling its gRPC call.

Why: with serve.postprocessing_dynamic_batching, cancelling the call does not stop the generation (Triton 2.51, and
every release through r26.06 as read in core). The ensemble marks only the stream's next postprocessing requests
cancelled, and the dynamic batcher answers them itself,
so postprocessing never sees the cancellation and never stops `tensorrt_llm`: the generation runs to max_tokens,
and before r26.03 the ensemble request, failed while `tensorrt_llm` still streams, never ends (docs/serving.md). A `stop` request
to the LLM model with the stream's request id ends the generation there instead (TensorRT-LLM's contract: an empty
final response); the ensemble then finishes as any request does, and no request is ever cancelled.

The stream's responses are read by a task of the call's own until the call ends: a consumer cancelled while it
waits (a client gone) must not cancel the gRPC read, as grpc.aio cancels the whole call then. After `cancel()` the
consumer's iteration ends at once; the stop is sent again, after `FIRST_REPEAT_S` and then twice as long each time up
to `LAST_REPEAT_S` (a stream still in preprocessing has nothing to stop yet), until the call ends; after `DRAIN_S`
without an end the call is cancelled after all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tritonclient.utils import np_to_triton_dtype

from clients.aio_transport import AioGrpcCall

FIRST_REPEAT_S = 0.02
LAST_REPEAT_S = 0.1  # as often as the models poll a cancellation (cancellation_check_period_ms)
STOP_TIMEOUT_S = 2.0
DRAIN_S = 30.0
_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class StoppingGrpcCall:
    """An `AioGrpcCall` to the ensemble whose `cancel()` sends `stop` to `stop_model` (same request id) instead.
    The tasks that stop and read a call to its end go into `stopping` (the event loop keeps only weak references to
    tasks), where the client's `close()` awaits them."""

    def __init__(
        self, call: AioGrpcCall, client: grpcaio.InferenceServerClient, stop_model: str, stopping: set[asyncio.Task[None]], *, drain_s: float = DRAIN_S
    ) -> None:
        self._call = call
        self._client = client
        self._stop_model = stop_model
        self._tasks = stopping
        self._drain_s = drain_s
        self._items: asyncio.Queue[Any] = asyncio.Queue()  # chunks, then a _Failed or _END
        self._stopping = False
        self._final = False  # the final response arrived: nothing left to stop
        self._loop = asyncio.get_running_loop()
        self._reader = self._keep(self._loop.create_task(self._read()))

    @property
    def request_id(self) -> str:
        return self._call.request_id

    async def chunks(self) -> AsyncIterator[Any]:
        while (item := await self._items.get()) is not _END:
            if isinstance(item, _Failed):
                raise item.error
            yield item
            if item.final:
                return  # the reader reads the call to its end

    def cancel(self) -> None:
        """Stop the generation; a no-op once the final response arrived. Synchronous (a finally block of a task being
        cancelled may call it) and callable from any thread (a stream's `__del__`)."""
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._begin_stop()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs the call any more
                self._loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        if self._stopping or self._final or self._reader.done():
            return
        self._stopping = True
        while not self._items.empty():  # responses not yet read are dropped: the consumer's iteration ends now
            self._items.get_nowait()
        self._items.put_nowait(_END)
        self._keep(self._loop.create_task(self._stop()))

    def close(self) -> None:
        self.cancel()  # after the final response the reader has ended and this does nothing

    def _keep(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self) -> None:
        try:
            async for chunk in self._call.chunks():
                self._final = self._final or chunk.final
                if not self._stopping:
                    self._items.put_nowait(chunk)
        except Exception as error:  # the consumer gets it, as from AioGrpcCall
            if not self._stopping:
                self._items.put_nowait(_Failed(error))
        finally:
            self._items.put_nowait(_END)

    async def _stop(self) -> None:
        deadline = self._loop.time() + self._drain_s
        repeat_s = FIRST_REPEAT_S
        while not self._reader.done():
            with contextlib.suppress(Exception):  # a refused or failed stop is sent again; the deadline bounds it
                await asyncio.wait_for(self._send_stop(), STOP_TIMEOUT_S)
            left = deadline - self._loop.time()
            if left <= 0:
                self._call.cancel()  # the stream did not end: cancel it after all
                return
            await asyncio.wait({self._reader}, timeout=min(repeat_s, left))
            repeat_s = min(repeat_s * 2, LAST_REPEAT_S)

    async def _send_stop(self) -> None:
        inputs = [
            _tensor("stop", np.array([[True]])),
            _tensor("input_lengths", np.array([[0]], np.int32)),
            _tensor("request_output_len", np.array([[1]], np.int32)),
        ]

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self._stop_model, "inputs": inputs, "request_id": self._call.request_id}

        async for _result, error in self._client.stream_infer(one_request()):
            if error is not None:
                raise error


def _tensor(name: str, array: NDArray[Any]) -> grpcaio.InferInput:
    tensor = grpcaio.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor

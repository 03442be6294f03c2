"""`AsyncTritonLLMClient`: the asyncio form of `TritonLLMClient` (same arguments, same errors).

gRPC uses `tritonclient.grpc.aio` (one channel, one call per request); HTTP uses aiohttp. Both
are created on first use inside the running event loop, so a client belongs to one loop: close
it with `await client.close()` (or `async with`) before that loop ends.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import aiohttp
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from clients.aio_stop import StoppingGrpcCall
from clients.aio_transport import AioGrpcCall, AioHttpCall
from clients.client import ClientSettings, ProtocolName, configure
from clients.defaults import DEFAULT_TIMEOUT_S
from clients.errors import ClientError
from clients.lora import SentAdapters
from clients.stream import AsyncBeamStream, AsyncTextStream
from clients.types import Completion, GenerationRequest


class AsyncTritonLLMClient(ClientSettings):
    """See `TritonLLMClient`; `generate` is awaited, `stream` is iterated with `async for`. With `stop_model` (the
    ensemble's LLM model, e.g. "tensorrt_llm"), a gRPC stream ended early is ended by a `stop` to that model and read
    to its end, never cancelled: what stops it when the ensemble's postprocessing is batched (aio_stop.py); `close()`
    then waits for such streams to end."""

    def __init__(
        self,
        url: str | None = None,
        protocol: ProtocolName = "grpc",
        model: str = "ensemble",
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retries: int = 2,
        retry_backoff_s: float = 0.25,
        stop_model: str | None = None,
    ) -> None:
        configure(self, url, protocol, model, timeout, retries, retry_backoff_s)
        self.stop_model = stop_model if protocol == "grpc" else None
        self._stopping: set[asyncio.Task[None]] = set()  # streams being stopped and read to their end
        self._grpc: grpcaio.InferenceServerClient | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self.sent_adapters = SentAdapters()  # the weights go with an adapter's first request (client.py)
        self._streams: weakref.WeakSet[AsyncTextStream] = weakref.WeakSet()  # close() cancels those still open

    async def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        bad_words: str | Sequence[str] | None = None,
        **options: Any,
    ) -> Completion:
        request = GenerationRequest(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop, bad_words=bad_words, **options)
        return await self.generate_request(request)

    def stream(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        bad_words: str | Sequence[str] | None = None,
        **options: Any,
    ) -> AsyncTextStream:
        """Text deltas; stop early with `async with` / `aclose()` / `cancel()` (gRPC: cancels on the server)."""
        request = GenerationRequest(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop, bad_words=bad_words, **options)
        return self.stream_request(request)

    async def generate_request(self, request: GenerationRequest) -> Completion:
        stream = self._text_stream(request, stream=False)
        async with stream:
            async for _ in stream:
                pass
        if stream.completion is None:  # pragma: no cover - only a cancel() from elsewhere gets here
            raise ClientError("the request was cancelled")
        return stream.completion

    def stream_request(self, request: GenerationRequest) -> AsyncTextStream:
        return self._text_stream(request, stream=True)

    def stream_beams(self, prompt: str, *, max_tokens: int, beam_width: int, stop: str | Sequence[str] | None = None, **options: Any) -> AsyncBeamStream:
        """Streamed beam search (see TritonLLMClient.stream_beams): each item every beam's text so far, whole, best first."""
        return self.stream_beams_request(GenerationRequest(prompt, max_tokens, stop=stop, beam_width=beam_width, **options))

    def stream_beams_request(self, request: GenerationRequest) -> AsyncBeamStream:
        return self._text_stream(request, stream=True, whole_beams=True)

    def model_stream(self, model: str, inputs: list[Any], outputs: list[Any], parse: Callable[[Any], Any]) -> AioGrpcCall:
        """One streamed gRPC request to any model of the server (`inputs` and `outputs` as tritonclient's
        grpc.aio InferInput / InferRequestedOutput), its results turned into chunks by `parse`; no retries."""
        return AioGrpcCall(self._grpc_client(), self.url, model, timeout=self.timeout, inputs=inputs, outputs=outputs, parse=parse)

    async def is_ready(self) -> bool:
        try:
            if self.protocol == "http":
                async with self._session().get(f"{self.url}/v2/models/{self.model}/ready", timeout=aiohttp.ClientTimeout(total=self.timeout)) as answer:
                    return answer.status == 200
            return bool(await self._grpc_client().is_model_ready(self.model, client_timeout=self.timeout))
        except (aiohttp.ClientError, InferenceServerException, TimeoutError):
            return False

    async def close(self) -> None:
        """Release every connection now; requests still open are cancelled (their iteration ends)."""
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()  # a no-op for a finished one
        if self._stopping:  # stopped streams end by themselves within a few engine steps (aio_stop.py bounds it)
            await asyncio.wait(set(self._stopping))
        grpc_client, self._grpc = self._grpc, None
        http, self._http = self._http, None
        if grpc_client is not None:
            await grpc_client.close()
        if http is not None:
            await http.close()

    async def __aenter__(self) -> AsyncTritonLLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _grpc_client(self) -> grpcaio.InferenceServerClient:
        if self._closed:
            raise ClientError("the client is closed")
        if self._grpc is None:
            self._grpc = grpcaio.InferenceServerClient(self.url)
        return self._grpc

    def _session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientError("the client is closed")
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        return self._http

    @overload
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: Literal[False] = False) -> AsyncTextStream: ...
    @overload
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: Literal[True]) -> AsyncBeamStream: ...
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: bool = False) -> AsyncTextStream:
        with_weights = request.lora is not None and self.sent_adapters.needs_weights(request.lora)
        values = request.inputs(stream=stream, whole_beams=whole_beams, lora_weights=with_weights)

        async def open_call() -> AioGrpcCall | StoppingGrpcCall | AioHttpCall:
            if self.protocol == "grpc":
                call = AioGrpcCall(self._grpc_client(), self.url, self.model, values, timeout=self.timeout)
                return call if self.stop_model is None else StoppingGrpcCall(call, self._grpc_client(), self.stop_model, self._stopping)
            return await AioHttpCall.open(self._session(), self.url, self.model, values, timeout=self.timeout)

        if self._closed:
            raise ClientError("the client is closed")
        stream_class = AsyncBeamStream if whole_beams else AsyncTextStream
        text_stream = stream_class(open_call, self.retry, protocol=self.protocol, max_tokens=request.max_tokens)
        self._streams.add(text_stream)
        return text_stream

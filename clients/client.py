"""`TritonLLMClient`: text in, text out, over HTTP or gRPC, against the served ensemble."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Literal, cast, overload

import requests
import requests.adapters
from tritonclient.utils import InferenceServerException

from clients.defaults import DEFAULT_TIMEOUT_S, DEFAULT_URLS
from clients.errors import ClientError, RequestError
from clients.grpc import ClientPool, GrpcCall, grpc_target
from clients.http import HttpCall, http_base_url
from clients.lora import NOT_CACHED, SentAdapters
from clients.retry import RetryPolicy
from clients.stream import BeamStream, TextStream
from clients.types import Completion, GenerationRequest

ProtocolName = Literal["grpc", "http"]


def check_protocol(protocol: str) -> ProtocolName:
    if protocol not in DEFAULT_URLS:
        raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
    return cast(ProtocolName, protocol)  # DEFAULT_URLS' keys are the two names


class _ClosingAdapter(requests.adapters.HTTPAdapter):
    """An adapter whose close() closes its idle keep-alive connections now.

    urllib3 2's `PoolManager.clear()` (what `Session.close()` calls) only forgets its pools; their
    connections are closed when a pool is garbage collected, which a finished response (it keeps a
    reference to its pool) can postpone indefinitely. An open keep-alive connection makes
    tritonserver wait its whole exit timeout at shutdown (and then exit 1).
    """

    def close(self) -> None:
        pools = self.poolmanager.pools
        for key in list(pools.keys()):
            pool = pools.get(key)
            if pool is not None:
                pool.close()  # a connection released to it later is closed instead of pooled
        super().close()


def _session() -> requests.Session:
    """A session whose pool keeps a connection per concurrent stream (the default keeps 10)."""
    session = requests.Session()
    adapter = _ClosingAdapter(pool_connections=1, pool_maxsize=64)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class ClientSettings:
    """The settings the sync and async clients share (set by `configure`)."""

    protocol: ProtocolName
    model: str
    timeout: float | None
    retry: RetryPolicy
    url: str  # normalised: host:port for gRPC, a base URL for HTTP


def configure(client: ClientSettings, url: str | None, protocol: str, model: str, timeout: float | None, retries: int, retry_backoff_s: float) -> None:
    """The settings the sync and async clients share: protocol, model, timeout, retry policy, normalised URL."""
    client.protocol = check_protocol(protocol)
    client.model = model
    client.timeout = timeout
    client.retry = RetryPolicy(retries=retries, backoff_s=retry_backoff_s)
    raw_url = url or DEFAULT_URLS[protocol]
    client.url = grpc_target(raw_url) if protocol == "grpc" else http_base_url(raw_url)


class TritonLLMClient(ClientSettings):
    """A client of one model (the ensemble by default) of a Triton server.

    `timeout` (seconds, None for none) bounds each request; past it `ClientTimeoutError` is raised
    (over gRPC the deadline also cancels a streamed request on the server). `retries` more attempts,
    `retry_backoff_s` apart (doubling), are made only while the server cannot be reached. The
    client is thread-safe: concurrent requests each get their own stream / connection.
    A request's LoRA adapter (`lora=LoraAdapter.from_dir(...)`) is sent as NVIDIA's client sends it: its weights with
    the first request of its task id, the id alone afterwards; `generate` sends the weights again, once, when the
    server answers that it has not cached the id (evicted, or restarted).
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: ProtocolName = "grpc",
        model: str = "ensemble",
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        retries: int = 2,
        retry_backoff_s: float = 0.25,
    ) -> None:
        configure(self, url, protocol, model, timeout, retries, retry_backoff_s)
        self._pool = ClientPool(self.url) if protocol == "grpc" else None
        self._session = _session() if protocol == "http" else None
        # Requests not yet garbage collected: close() cancels those still open (a stream not read to its end).
        self._streams: weakref.WeakSet[TextStream] = weakref.WeakSet()
        self._streams_lock = threading.Lock()
        self._closed = False
        self.sent_adapters = SentAdapters()

    # -- requests ---------------------------------------------------------------------------
    def generate(
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
        """The whole answer at once. `options`: any other `GenerationRequest` field
        (repetition_penalty, presence_penalty, frequency_penalty, min_tokens, end_id, pad_id,
        exclude_input_in_output, return_log_probs, guided_decoding_guide_type, guided_decoding_guide)."""
        request = GenerationRequest(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop, bad_words=bad_words, **options)
        return self.generate_request(request)

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
    ) -> TextStream:
        """Text deltas as the server produces them; the request is sent when iteration starts.
        Stop early with `break` (the dropped stream cancels), `close()`, `cancel()` (from any
        thread) or a `with` block: over gRPC that cancels the request on the server too.
        `completion` holds the whole answer after the last delta."""
        request = GenerationRequest(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop, bad_words=bad_words, **options)
        return self.stream_request(request)

    def generate_request(self, request: GenerationRequest) -> Completion:
        try:
            return self._generate(request)
        except RequestError as error:
            if request.lora is None or NOT_CACHED not in error.message:
                raise
            self.sent_adapters.forget(request.lora)
            return self._generate(request)

    def _generate(self, request: GenerationRequest) -> Completion:
        stream = self._text_stream(request, stream=False)
        with stream:
            for _ in stream:
                pass
        if stream.completion is None:  # pragma: no cover - only a cancel() from another thread gets here
            raise ClientError("the request was cancelled")
        return stream.completion

    def stream_request(self, request: GenerationRequest) -> TextStream:
        return self._text_stream(request, stream=True)

    def stream_beams(self, prompt: str, *, max_tokens: int, beam_width: int, stop: str | Sequence[str] | None = None, **options: Any) -> BeamStream:
        """Streamed beam search: each item is every returned beam's text so far, whole and best first (TensorRT-LLM
        streams beams whole, since a beam may continue another from one step to the next); `completion.beams` at
        the end. Stops early as `stream` does. `options`: other `GenerationRequest` fields (length_penalty, ...)."""
        return self.stream_beams_request(GenerationRequest(prompt, max_tokens, stop=stop, beam_width=beam_width, **options))

    def stream_beams_request(self, request: GenerationRequest) -> BeamStream:
        return self._text_stream(request, stream=True, whole_beams=True)

    # -- server -----------------------------------------------------------------------------
    def is_ready(self) -> bool:
        """Whether the model is ready (False when the server cannot be reached)."""
        if self._closed:
            return False
        try:
            if self._session is not None:
                response = self._session.get(f"{self.url}/v2/models/{self.model}/ready", timeout=self.timeout)
                return response.status_code == 200
            if self._pool is not None:
                client = self._pool.acquire()
                healthy = False
                try:
                    ready = bool(client.is_model_ready(self.model, client_timeout=self.timeout))
                    healthy = True
                    return ready
                finally:
                    self._pool.release(client, healthy=healthy)
        except (requests.RequestException, InferenceServerException, ClientError):
            return False
        return False

    def close(self) -> None:
        """Release every connection now; requests still open are cancelled (their iteration ends)."""
        with self._streams_lock:
            self._closed = True
            streams = list(self._streams)
        for stream in streams:
            stream.cancel()  # a no-op for a finished one
        if self._pool is not None:
            self._pool.close()
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> TritonLLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------
    @overload
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: Literal[False] = False) -> TextStream: ...
    @overload
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: Literal[True]) -> BeamStream: ...
    def _text_stream(self, request: GenerationRequest, *, stream: bool, whole_beams: bool = False) -> TextStream:
        with_weights = request.lora is not None and self.sent_adapters.needs_weights(request.lora)
        values = request.inputs(stream=stream, whole_beams=whole_beams, lora_weights=with_weights)
        pool, session = self._pool, self._session

        def open_call() -> GrpcCall | HttpCall:
            if self._closed:  # a close() after this check cancels the stream, which cancels the call
                raise ClientError("the client is closed")
            if pool is not None:
                return GrpcCall(pool, self.model, values, timeout=self.timeout)
            if session is not None:
                return HttpCall(session, self.url, self.model, values, timeout=self.timeout)
            raise ClientError("the client has no transport")  # pragma: no cover - one of the two exists

        stream_class = BeamStream if whole_beams else TextStream
        text_stream = stream_class(open_call, self.retry, protocol=self.protocol, max_tokens=request.max_tokens)
        with self._streams_lock:
            if self._closed:
                raise ClientError("the client is closed")
            self._streams.add(text_stream)
        return text_stream

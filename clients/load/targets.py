"""Where the load goes: Triton's ensemble (gRPC or HTTP streaming) or an OpenAI-compatible server.

A target sends one `LoadRequest` and fills its `RequestRecord` as responses arrive. Every request
is streamed (time to first token needs it) and greedy; Triton requests ask for log-probs, from
which each response's token count is known.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import httpx

from clients.aio import AsyncTritonLLMClient
from clients.api_keys import bearer_headers
from clients.client import check_protocol
from clients.load.llmapi_target import LLMAPI_MODEL, LlmapiModelTarget
from clients.load.records import LoadRequest, RequestRecord
from clients.sse import openai_events

ENDPOINTS = ("grpc", "http", "openai")


class LoadTarget(Protocol):
    endpoint: str
    url: str

    async def send(self, request: LoadRequest, record: RequestRecord) -> None: ...
    async def close(self) -> None: ...


class TritonTarget:
    """The ensemble (or another model with its contract) over gRPC or HTTP streaming."""

    def __init__(self, url: str, protocol: str, model: str = "ensemble", timeout_s: float = 600.0) -> None:
        self.endpoint = protocol
        self._client = AsyncTritonLLMClient(url, protocol=check_protocol(protocol), model=model, timeout=timeout_s, retries=0)
        self.url = self._client.url

    async def send(self, request: LoadRequest, record: RequestRecord) -> None:
        stream = self._client.stream(
            request.prompt,
            max_tokens=request.max_tokens,
            temperature=0.0,
            min_tokens=request.max_tokens if request.exact_output else None,
            return_log_probs=True,
        )
        async with stream:
            async for _ in stream:
                _count_new_tokens(record, stream.tokens_received, time.monotonic())
        now = time.monotonic()
        _count_new_tokens(record, stream.tokens_received, now)  # a last response with no text
        record.end = now

    async def close(self) -> None:
        await self._client.close()


def _count_new_tokens(record: RequestRecord, received: int | None, now: float) -> None:
    if received is None:  # the server gave no log-probs: one token per text delta
        record.add_tokens(1, now)
    elif received > record.output_tokens:
        record.add_tokens(received - record.output_tokens, now)


class OpenAITarget:
    """`POST /v1/completions` with `stream: true`; token counts from the final `usage`. With `api_key`, every
    request carries `Authorization: Bearer <api_key>`."""

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.endpoint = "openai"
        self.url = base_url.rstrip("/")
        if not self.url.endswith("/v1"):
            self.url += "/v1"
        self.model = model
        self._http = httpx.AsyncClient(
            timeout=timeout_s, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256), headers=bearer_headers(api_key)
        )

    def body(self, request: LoadRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.exact_output:
            body["min_tokens"] = request.max_tokens  # the extension vLLM and trtllm-serve accept too
        return body

    async def send(self, request: LoadRequest, record: RequestRecord) -> None:
        usage_tokens = None
        async with self._http.stream("POST", f"{self.url}/completions", json=self.body(request)) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")[:300]
                raise RuntimeError(f"HTTP {response.status_code}: {detail}")
            async for event in openai_events(response.aiter_lines()):
                if any(choice.get("text") for choice in event.get("choices") or ()):
                    record.add_tokens(1, time.monotonic())
                usage = event.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens")
        record.end = time.monotonic()
        if usage_tokens is not None:
            record.output_tokens = int(usage_tokens)

    async def close(self) -> None:
        await self._http.aclose()


CONTRACTS = ("ensemble", "llmapi")  # the Triton tensors a grpc|http target speaks: the ensemble's or NVIDIA's llmapi model's


def make_target(
    endpoint: str, url: str, *, model: str | None = None, timeout_s: float = 600.0, contract: str = "ensemble", api_key: str | None = None
) -> LoadTarget:
    """`endpoint` grpc|http (Triton; `model` defaults to the ensemble, or with contract "llmapi" to NVIDIA's llmapi
    model over http) or openai (`model` = the served name; `api_key`: the Bearer key it sends, if any)."""
    if contract == "llmapi" and endpoint in ("grpc", "http"):
        if endpoint == "grpc":
            raise ValueError("the llmapi model is measured over http (its generate_stream); grpc streaming of its contract is not implemented")
        return LlmapiModelTarget(url, model or LLMAPI_MODEL, timeout_s)
    if contract not in CONTRACTS:
        raise ValueError(f"contract must be one of {', '.join(CONTRACTS)}, got {contract!r}")
    if endpoint in ("grpc", "http"):
        return TritonTarget(url, endpoint, model or "ensemble", timeout_s)
    if endpoint == "openai":
        if not model:
            raise ValueError("the openai endpoint needs the served model name")
        return OpenAITarget(url, model, timeout_s, api_key)
    raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")

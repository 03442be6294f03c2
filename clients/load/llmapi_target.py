"""Load on the Triton form of the llmapi target: NVIDIA's `llmapi` model (`tensorrt_llm`), whose tensors are not the
ensemble's — `text_input`, `streaming`, `sampling_param_max_tokens`, `sampling_param_temperature` in, `text_output`
(with `finish_reason`, `stop_reason`) out — over Triton's HTTP `generate_stream` (server-sent events).

The model returns text, no token ids or log-probs: each non-empty `text_output` chunk counts as one token (LLM()
streams one step per response). It has no `min_tokens` input either, so `exact_output` cannot be asked for: output
lengths are the model's, up to `max_tokens`. gRPC streaming of this contract is not implemented (HTTP only).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from clients.load.records import LoadRequest, RequestRecord
from clients.sse import SSEParser

LLMAPI_MODEL = "tensorrt_llm"  # the one model of NVIDIA's llmapi layout


class LlmapiModelTarget:
    endpoint = "http"

    def __init__(self, url: str, model: str = LLMAPI_MODEL, timeout_s: float = 600.0) -> None:
        self.url = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.url = self.url.rstrip("/")
        self.model = model
        self._http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    @staticmethod
    def body(request: LoadRequest) -> dict[str, Any]:
        """Greedy and streamed, in the tensor names of NVIDIA's llmapi config.pbtxt."""
        return {
            "text_input": request.prompt,
            "streaming": True,
            "sampling_param_max_tokens": request.max_tokens,
            "sampling_param_temperature": 0.0,
            "return_finish_reason": True,
        }

    async def send(self, request: LoadRequest, record: RequestRecord) -> None:
        parser = SSEParser()
        path = f"{self.url}/v2/models/{self.model}/generate_stream"
        async with self._http.stream("POST", path, json=self.body(request)) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")[:300]
                raise RuntimeError(f"HTTP {response.status_code}: {detail}")
            async for raw in response.aiter_bytes():
                for event in parser.feed(raw):
                    _count(record, json.loads(event.data))
            for event in parser.close():
                _count(record, json.loads(event.data))
        record.end = time.monotonic()

    async def close(self) -> None:
        await self._http.aclose()


def _count(record: RequestRecord, event: dict[str, Any]) -> None:
    if "error" in event:
        raise RuntimeError(f"stream error: {event['error']}")
    if event.get("text_output"):
        record.add_tokens(1, time.monotonic())

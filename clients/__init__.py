"""Clients of a served trtllm-pipeline deployment (HTTP, gRPC, streaming); they depend only on the served contract.

    from clients import TritonLLMClient
    with TritonLLMClient("localhost:8001", protocol="grpc") as client:
        print(client.generate("def fib(n):", max_tokens=32).text)
        for delta in client.stream("import os\\n", max_tokens=32):
            print(delta, end="", flush=True)
        for beams in client.stream_beams("def fib(n):", max_tokens=32, beam_width=4):
            print(beams[0])  # every beam whole at each step, best first

`AsyncTritonLLMClient` is the asyncio form. Errors: `RequestError` (Triton refused the request;
never retried), `ServerUnavailableError` (retried with backoff, then raised),
`ClientTimeoutError` (also a `TimeoutError`), `InvalidRequestError` (a value refused before
sending, naming the field; also a `TypeError` and a `ValueError`), all `ClientError`s.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Where each public name lives. Imported on first use (PEP 562), so that importing one submodule
# (e.g. `clients.cli` for its argument parser) does not load tritonclient, grpc and aiohttp.
_EXPORTS = {
    "AsyncTritonLLMClient": "clients.aio",
    "DEFAULT_URLS": "clients.client",
    "TritonLLMClient": "clients.client",
    "ClientError": "clients.errors",
    "ClientTimeoutError": "clients.errors",
    "InvalidRequestError": "clients.errors",
    "ProtocolError": "clients.errors",
    "RequestError": "clients.errors",
    "ServerUnavailableError": "clients.errors",
    "LoraAdapter": "clients.lora",
    "RetryPolicy": "clients.retry",
    "AsyncBeamStream": "clients.stream",
    "AsyncTextStream": "clients.stream",
    "BeamStream": "clients.stream",
    "TextStream": "clients.stream",
    "Completion": "clients.types",
    "GenerationRequest": "clients.types",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from clients.aio import AsyncTritonLLMClient
    from clients.client import TritonLLMClient
    from clients.defaults import DEFAULT_URLS
    from clients.errors import ClientError, ClientTimeoutError, InvalidRequestError, ProtocolError, RequestError, ServerUnavailableError
    from clients.lora import LoraAdapter
    from clients.retry import RetryPolicy
    from clients.stream import AsyncBeamStream, AsyncTextStream, BeamStream, TextStream
    from clients.types import Completion, GenerationRequest

__all__ = [
    "DEFAULT_URLS",
    "AsyncBeamStream",
    "AsyncTextStream",
    "AsyncTritonLLMClient",
    "BeamStream",
    "ClientError",
    "ClientTimeoutError",
    "Completion",
    "GenerationRequest",
    "InvalidRequestError",
    "LoraAdapter",
    "ProtocolError",
    "RequestError",
    "RetryPolicy",
    "ServerUnavailableError",
    "TextStream",
    "TritonLLMClient",
]

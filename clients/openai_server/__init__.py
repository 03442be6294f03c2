"""An OpenAI-compatible HTTP API in front of the served ensemble (any target: cpu or engine).

    from clients.openai_server import running_openai_server
    with running_openai_server("127.0.0.1:8001", model_name="tiny-cpu") as base_url:
        ...  # http://127.0.0.1:<port>/v1: /models, /completions, /chat/completions

It calls Triton over gRPC streaming through `AsyncTritonLLMClient`, so it depends only on the
served contract (ensemble inputs and outputs, and the preprocessing model's parameters).

Modules, one job each: `schemas` (request/response bodies), `errors` (OpenAI's error shape and
status codes), `bodies` (reading a body within the size and nesting limits, parsing it), `model`
(the served model's facts), `tokenizer` and `templating` (prompt token counts, chat templates),
`stops` (stop sequences on a text stream), `planning` (request → Triton requests, or a 4xx),
`generation` (running them), `responses` (bodies, chunks, SSE), `openapi` (what /openapi.json
documents), `access` (API keys and per-key limits), `routes` (paths and their metric labels),
`app` (FastAPI), `runner` (uvicorn).
"""

from __future__ import annotations

import importlib
from typing import Any

# Exported lazily: importing the package (e.g. its `defaults` for a command line's parser) does
# not import FastAPI and uvicorn.
_EXPORTS = {
    "AccessPolicy": "access",
    "KeyRing": "access",
    "ModelSetupError": "model",
    "OpenAIError": "errors",
    "ServedModel": "model",
    "ServerSettings": "app",
    "create_app": "app",
    "running_openai_server": "runner",
    "serve_openai": "runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)

"""Running the app with uvicorn: in a background thread (`running_openai_server`, a context manager),
or in the foreground until Ctrl-C / SIGTERM (`serve_openai`, what `trtllm-pipeline openai` uses).

The listening socket is bound before uvicorn starts, so port 0 picks a free port, and a port in
use fails at once (OSError) instead of inside the server thread.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn

from clients.lora import LoraAdapter
from clients.openai_server.access import AccessPolicy
from clients.openai_server.app import ServerSettings, create_app
from clients.openai_server.defaults import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_N,
    DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT_S,
)
from clients.openai_server.model import ModelSetupError, ServedModel

GRACEFUL_SHUTDOWN_S = 5


def base_url(host: str, port: int) -> str:
    """The URL a local client uses (loopback when the server listens on every address)."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/v1"


def resolve_model(
    triton_url: str, *, model_name: str, model: ServedModel | None = None, model_repository: str | Path | None = None, triton_model: str = "ensemble"
) -> ServedModel:
    """`model` as given, else read from `model_repository`, else asked from Triton itself."""
    if model is not None:
        return model
    if model_repository is not None:
        return ServedModel.from_repository(model_repository, name=model_name, triton_model=triton_model)
    return ServedModel.from_triton(triton_url, name=model_name, triton_model=triton_model)


@contextlib.contextmanager
def running_openai_server(
    triton_url: str,
    *,
    model_name: str,
    host: str = DEFAULT_HOST,
    port: int = 0,
    model: ServedModel | None = None,
    model_repository: str | Path | None = None,
    triton_model: str = "ensemble",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    max_n: int = DEFAULT_MAX_N,
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
    access: AccessPolicy | None = None,
    adapters: Mapping[str, LoraAdapter] | None = None,
    startup_timeout_s: float = 30.0,
    log_level: str = "warning",
) -> Iterator[str]:
    """Serve the OpenAI API in a background thread; yields its base URL (`http://host:port/v1`).

        with running_openai_server("127.0.0.1:8001", model_name="tiny-cpu", port=0) as base_url:
            openai.OpenAI(base_url=base_url, api_key="unused").completions.create(model="tiny-cpu", ...)

    `triton_url`: Triton's gRPC `host:port`. `model_name`: the name clients pass as `model`.
    `port` 0 picks a free port. The tokenizer and context limits come from `model` (a
    `ServedModel`), else from the preprocessing model's config in `model_repository`, else from
    the running Triton's model-configuration API. `max_body_bytes`: larger bodies get 413;
    `max_json_depth`: bodies whose arrays/objects nest deeper get 400 (`json_too_deep`).
    `max_n`: most choices (n × prompts) per request. `request_timeout_s`: deadline of each Triton
    request (None: none). `access`: API keys and per-key limits (default: none, everyone is served).
    `adapters`: LoRA adapters served beside the model, by the name clients pass as `model` (vLLM's --lora-modules).
    Uvicorn's access log stays off. Raises ModelSetupError (facts not found), OSError (port in use) or
    RuntimeError (not started within `startup_timeout_s`). On exit the server stops: open
    streams are cancelled on Triton.
    """
    served = resolve_model(triton_url, model_name=model_name, model=model, model_repository=model_repository, triton_model=triton_model)
    settings = ServerSettings(
        triton_url,
        served,
        max_body_bytes=max_body_bytes,
        max_json_depth=max_json_depth,
        max_n=max_n,
        request_timeout_s=request_timeout_s,
        access=access or AccessPolicy(),
        adapters=dict(adapters or {}),
    )
    app = create_app(settings)
    listener = _bind(host, port)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, loop="asyncio", lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="openai-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the OpenAI-compatible server stopped while starting; see its log above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI-compatible server did not start within {startup_timeout_s:g} s")
            time.sleep(0.02)
        yield base_url(host, listener.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(GRACEFUL_SHUTDOWN_S + 10)
        listener.close()


def serve_openai(
    triton_url: str,
    *,
    model: ServedModel,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    on_ready: Callable[[str], None] = print,
    keep_running: Callable[[], bool] = lambda: True,
    **options: Any,
) -> int:
    """Serve until Ctrl-C / SIGTERM (or until `keep_running()` turns false, checked twice a second);
    `on_ready(base_url)` once it listens. `options`: those of `running_openai_server`. Returns 0."""
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        with running_openai_server(triton_url, model_name=model.name, model=model, host=host, port=port, log_level="info", **options) as url:
            on_ready(url)
            while not stop.wait(0.5) and keep_running():
                pass
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, and TCP_NODELAY set (accepted sockets inherit it): asyncio turns Nagle off
    # only on sockets whose proto is IPPROTO_TCP. With Nagle on, the first SSE event waits behind the
    # un-acknowledged response headers until the client's delayed ACK (~40 ms on Linux): AIPerf
    # (aiohttp) saw every stream's first 5 tokens arrive together, 40+ ms late.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from None
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ModelSetupError", "base_url", "resolve_model", "running_openai_server", "serve_openai"]

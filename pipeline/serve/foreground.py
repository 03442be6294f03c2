"""`serve_foreground`: run the server until Ctrl-C or SIGTERM, then stop it cleanly."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from pipeline.errors import ToolError
from pipeline.serve.cleanup import signal_text
from pipeline.serve.command import ServerOptions
from pipeline.serve.server import TritonServer

_Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal returns and accepts

_POLL_SECONDS = 0.5


def serve_foreground(options: ServerOptions, *, out: Callable[[str], None] = print, timeout: float = 120.0) -> int:
    """Start, print the URLs, block until interrupted; 0 after a requested stop.

    Raises ToolError (with the log tail) if the server fails to start or dies on its own.
    """
    stop_requested = threading.Event()
    previous = _install_handlers(stop_requested)
    try:
        with TritonServer(options) as server:
            states = server.wait_until_ready(timeout)
            out(f"tritonserver is ready (pid {server.pid}); models: {', '.join(sorted(states))}")
            out(f"  HTTP     {options.http_url}   e.g. POST {options.http_url}/v2/models/<model>/generate")
            out(f"  gRPC     {options.grpc_url}")
            out(f"  metrics  {options.metrics_url}")
            out(f"  log      {server.log_path}")
            out("Press Ctrl-C to stop.")
            while not stop_requested.wait(_POLL_SECONDS):
                if not server.is_running():
                    raise _exited_on_its_own(server)
                if (fatal := server.fatal_signal()) is not None:
                    raise _exited_on_its_own(server, hung=fatal)
            out("stopping tritonserver ...")
        return 0
    finally:
        _restore_handlers(previous)


def _exited_on_its_own(server: TritonServer, hung: str | None = None) -> ToolError:
    """Stop (clean up after) a server that exited by itself, or crashed and hung (`hung`: the log's
    signal line; it is killed): an error saying how, and what was left."""
    tail = server.log_tail()  # before stop(): the log goes with the temporary workspace
    returncode = server.stop()
    what = f"tritonserver crashed ({hung}) and hung in its signal handler; it was killed" if hung else "tritonserver exited on its own"
    if returncode is not None and returncode < 0 and not hung:
        what += f": it crashed ({signal_text(-returncode)})"
    summary = server.last_cleanup.summary() if server.last_cleanup else ""
    if summary:
        what += f"\ncleaned up: {summary}"
    return ToolError(server.command, returncode or -1, f"{what}\n{tail}")


def _install_handlers(stop_requested: threading.Event) -> dict[int, _Handler]:
    previous: dict[int, _Handler] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous  # signal handlers can only be set from the main thread

    def request_stop(signum, frame):
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, request_stop)
    return previous


def _restore_handlers(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)

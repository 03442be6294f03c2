"""A server that outlives the command that started it: `serve --detach`, then `stop`.

The starting command leaves a state file (`server.json`) in a directory of its choosing; `stop`
reads it, checks that the recorded pid is still that server (pid plus process start time, so a
reused pid is never signalled), stops it like `TritonServer.stop`, and removes what it leaked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import PipelineError, StageError
from pipeline.serve import leaks, process
from pipeline.serve.command import ServerOptions
from pipeline.serve.server import TritonServer

STATE_FILE = "server.json"
WORKSPACE_DIR = "workspace"
LAST_LOG = "tritonserver.last.log"
_STOP_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class ServerState:
    pid: int
    start_ticks: int
    command: list[str]
    http_url: str
    grpc_url: str
    metrics_url: str
    log_path: str
    shm_prefix: str
    python_env_dirs: list[str]
    exit_timeout_secs: int
    workspace: str
    model_repository: str
    started_at: str

    def is_running(self) -> bool:
        process.reap_if_child(self.pid)
        return process.is_same_process(self.pid, self.start_ticks)


def start_detached(options: ServerOptions, state_dir: Path, *, timeout: float = 120.0) -> ServerState:
    """Start a server that keeps running after this process exits; wait until it is ready."""
    existing = read_state(state_dir)
    if existing is not None:
        if existing.is_running():
            raise StageError(
                f"a server started from {state_dir} is already running (pid {existing.pid}, {existing.http_url})",
                hint="stop it first: trtllm-pipeline stop",
            )
        _clean_up(existing, state_dir)
    workspace = state_dir / WORKSPACE_DIR
    if workspace.exists():
        shutil.rmtree(workspace)
    server = TritonServer(options, workspace=workspace).start()
    server.wait_until_ready(timeout)
    ticks = process.start_time_ticks(server.pid)
    if ticks is None:
        raise StageError(f"tritonserver (pid {server.pid}) vanished right after becoming ready; see {server.log_path}")
    state = ServerState(
        pid=server.pid,
        start_ticks=ticks,
        command=server.command,
        http_url=options.http_url,
        grpc_url=options.grpc_url,
        metrics_url=options.metrics_url,
        log_path=str(server.log_path),
        shm_prefix=options.shm_prefix,
        python_env_dirs=[str(p) for p in server.python_env_dirs],
        exit_timeout_secs=options.exit_timeout_secs,
        workspace=str(workspace),
        model_repository=str(options.model_repository),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    _write_state(state_dir, state)
    server.detach()
    return state


def read_state(state_dir: Path) -> ServerState | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        return ServerState(**json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, TypeError) as error:
        raise StageError(f"{path}: unreadable server state ({error}); remove it if no server is running") from None


def stop_detached(state_dir: Path) -> ServerState:
    """Stop the server recorded in `state_dir`; its state as recorded. PipelineError if none is."""
    state = read_state(state_dir)
    if state is None:
        raise PipelineError(f"no server is recorded in {state_dir / STATE_FILE}", hint="start one with: trtllm-pipeline serve CONFIG --detach")
    if state.is_running():
        process.signal_process(state.pid, signal.SIGTERM)
        if not process.wait_until(lambda: not state.is_running(), state.exit_timeout_secs + _STOP_GRACE_SECONDS):
            process.kill_group(state.pid)
        # The group id is the server's pid; only right after it exited is the group surely its own.
        if process.group_alive(state.pid):  # stubs outliving the server
            if not process.wait_until(lambda: not process.group_alive(state.pid), 5.0):
                process.kill_group(state.pid)
    _clean_up(state, state_dir)
    return state


def _clean_up(state: ServerState, state_dir: Path) -> None:
    leaks.remove_shm_regions(state.shm_prefix)
    leaks.remove_empty_dirs([Path(p) for p in state.python_env_dirs])
    log = Path(state.log_path)
    if log.is_file():  # keep the last server's log where `stop` can point to it
        log.replace(state_dir / LAST_LOG)
    shutil.rmtree(state.workspace, ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)


def _write_state(state_dir: Path, state: ServerState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    temporary = state_dir / f".{STATE_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(asdict(state), indent=2) + "\n")
    temporary.replace(state_dir / STATE_FILE)

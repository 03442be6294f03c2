"""A server that outlives the command that started it: `serve --detach`, then `stop`.

The starting command leaves a state file (`server.json`) in a directory of its choosing; `stop`
reads it, checks that the recorded pid is still that server (pid plus process start time, so a
reused pid is never signalled), stops it like `TritonServer.stop`, and removes what it leaked.

A server that crashed (or was killed) leaves its Python-backend stubs running in its process group.
`stop`, and `start_detached` finding such a stale state, end what is verifiably left of that group
(`process.end_server_group`), and of stubs started from the workspace by an earlier server whose
state was lost (`process.orphaned_stubs`), and say so in a `StopResult`. The state file is removed
only after every such process is gone; otherwise a StageError names the pids and the state stays
for a rerun.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import PipelineError, StageError
from pipeline.serve import leaks, process
from pipeline.serve.cleanup import Cleanup, check_all_gone, crash_signal, signal_text
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


def start_detached(
    options: ServerOptions,
    state_dir: Path,
    *,
    timeout: float = 120.0,
    on_cleanup: Callable[[StopResult], None] | None = None,
) -> ServerState:
    """Start a server that keeps running after this process exits; wait until it is ready.

    What an earlier server of `state_dir` left (a stale state of a server that exited or crashed,
    stubs still running) is removed first and passed to `on_cleanup`.
    """
    existing = read_state(state_dir)
    if existing is not None and existing.is_running():
        raise StageError(
            f"a server started from {state_dir} is already running (pid {existing.pid}, {existing.http_url})",
            hint="stop it first: trtllm-pipeline stop",
        )
    leftover = _clean_up(existing, state_dir, already_exited=True) if existing is not None else _clean_up_orphans(state_dir)
    if leftover is not None and on_cleanup is not None:
        on_cleanup(leftover)
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


@dataclass(frozen=True)
class StopResult:
    """What `stop_detached` (or `start_detached`, for a stale state) found and did."""

    state: ServerState | None  # None: no server recorded, only orphaned stubs of one were ended
    already_exited: bool  # the server was not running any more (crashed, killed, exited on its own)
    crash_signal: int | None  # from its log (`Signal (11) received.`)
    log_path: Path | None  # its log, where it is now
    killed_after_timeout: bool  # it did not exit within its exit timeout after SIGTERM
    cleanup: Cleanup
    state_dir: Path

    @property
    def pid(self) -> int | None:
        return self.state.pid if self.state else None

    @property
    def http_url(self) -> str | None:
        return self.state.http_url if self.state else None

    def message(self) -> str:
        summary = self.cleanup.summary()
        if self.state is None:
            return f"no server is recorded in {self.state_dir / STATE_FILE}; {summary}"
        if not self.already_exited:
            text = f"stopped the server (pid {self.pid}) that served {self.http_url}"
            if self.killed_after_timeout:
                text += f" (killed: it had not exited {self.state.exit_timeout_secs + _STOP_GRACE_SECONDS:.0f} s after SIGTERM)"
            return text + (f"; {summary}" if summary else "")
        text = f"the server (pid {self.pid}) that served {self.http_url} had already exited"
        if self.crash_signal is not None:
            text += f": it crashed ({signal_text(self.crash_signal)})"
        if self.log_path is not None:
            text += f"; see {self.log_path}"
        return text + f"\ncleaned up: {summary or 'nothing of it was left running'}"


def stop_detached(state_dir: Path) -> StopResult:
    """Stop the server recorded in `state_dir` and clean up after it, also when it had crashed.

    PipelineError if no server is recorded (and nothing of an earlier one still runs); StageError,
    keeping the state file, if a process of the server's group cannot be ended.
    """
    state = read_state(state_dir)
    if state is None:
        orphans = _clean_up_orphans(state_dir)
        if orphans is not None:
            return orphans
        raise PipelineError(f"no server is recorded in {state_dir / STATE_FILE}", hint="start one with: trtllm-pipeline serve CONFIG --detach")
    if not state.is_running():
        return _clean_up(state, state_dir, already_exited=True)
    process.signal_process(state.pid, signal.SIGTERM)
    exited = process.wait_until(lambda: not state.is_running(), state.exit_timeout_secs + _STOP_GRACE_SECONDS)
    # Exited: its stubs get a moment to follow. Not exited: the server and its group are killed.
    return _clean_up(state, state_dir, already_exited=False, wait=5.0 if exited else 0.0, killed_after_timeout=not exited)


def _clean_up(state: ServerState, state_dir: Path, *, already_exited: bool, wait: float = 0.0, killed_after_timeout: bool = False) -> StopResult:
    group = process.end_server_group(state.pid, state.start_ticks, state.shm_prefix, wait=wait)
    orphans, orphans_failed = process.kill_processes(process.orphaned_stubs(Path(state.workspace)))
    keeps = f"{state_dir / STATE_FILE} is kept: run the command again once they are gone"
    check_all_gone(group.failed, f"the server (pid {state.pid}) started from {state_dir}", pgid=state.pid, keeps=keeps)
    check_all_gone(orphans_failed, f"the stubs an earlier server left in {state.workspace}", keeps=keeps)
    log = Path(state.log_path)
    signum = crash_signal(log) if already_exited else None
    shm_regions = leaks.remove_shm_regions(state.shm_prefix)
    env_dirs = leaks.remove_empty_dirs([Path(p) for p in state.python_env_dirs])
    kept_log = None
    if log.is_file():  # keep the last server's log where `stop` can point to it
        kept_log = state_dir / LAST_LOG
        log.replace(kept_log)
    shutil.rmtree(state.workspace, ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return StopResult(
        state=state,
        already_exited=already_exited,
        crash_signal=signum,
        log_path=kept_log,
        killed_after_timeout=killed_after_timeout,
        cleanup=Cleanup(group=group, shm_regions=tuple(shm_regions), python_env_dirs=tuple(env_dirs), orphans=tuple(orphans)),
        state_dir=state_dir,
    )


def _clean_up_orphans(state_dir: Path) -> StopResult | None:
    """Without a state file: end stubs that an earlier server (state lost) left in the workspace."""
    found = process.orphaned_stubs(state_dir / WORKSPACE_DIR)
    if not found:
        return None
    killed, failed = process.kill_processes(found)
    check_all_gone(failed, f"the stubs an earlier server left in {state_dir / WORKSPACE_DIR}")
    return StopResult(
        state=None,
        already_exited=True,
        crash_signal=None,
        log_path=None,
        killed_after_timeout=False,
        cleanup=Cleanup(group=process.GroupCleanup(pgid=0), orphans=tuple(killed)),
        state_dir=state_dir,
    )


def _write_state(state_dir: Path, state: ServerState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    temporary = state_dir / f".{STATE_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(asdict(state), indent=2) + "\n")
    temporary.replace(state_dir / STATE_FILE)

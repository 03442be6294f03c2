"""`TritonServer`: start the bundled tritonserver on a model repository, wait for it, stop it.

    with TritonServer(ServerOptions(model_repository=repo, http_port=8000, ...)) as server:
        server.wait_until_ready()
        ...  # clients talk to server.options.http_url / grpc_url
    # stopped: SIGTERM, then SIGKILL of the process group after the exit timeout; leaks removed

The server runs on a private copy of the repository inside its workspace (the Python stubs write
`__pycache__` next to model.py; the artifact itself must stay as its manifest says). The binary is
started directly (exec semantics: the tracked pid is the server's) in its own process group, with
its output in `<workspace>/tritonserver.log`. `stop` also cleans up after a server that crashed: what
is verifiably left of its process group (Python-backend stubs) is killed (`process.end_server_group`),
and `last_cleanup` says what was removed.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pipeline.errors import StageError, ToolError
from pipeline.serve import leaks, probe, process
from pipeline.serve.cleanup import CRASH_SIGNALS, Cleanup, check_all_gone, received_signals, signal_line
from pipeline.serve.command import ServerOptions, server_command
from pipeline.serve.installation import TritonInstallation, find_tritonserver, make_backend_directory, server_environment

LOG_NAME = "tritonserver.log"
_LOG_TAIL_LINES = 40
_LOG_ERROR_LINES = 20
_ERROR_LINE = re.compile(r"^E\d{4} ")
_HARMLESS_ERRORS = (  # logged by every CPU-only server
    "CudaDriverHelper has not been initialized",
    "CUDA driver version is insufficient",
)
_READY_POLL_SECONDS = 0.1
_FATAL_SCAN_BYTES = 1 << 16
# Beyond --exit-timeout-secs: Triton's unload loop polls once per second and stubs need a moment.
_STOP_GRACE_SECONDS = 10.0


class TritonServer:
    def __init__(
        self,
        options: ServerOptions,
        *,
        workspace: Path | None = None,
        installation: TritonInstallation | None = None,
    ) -> None:
        self.options = options
        self._installation = installation
        self._given_workspace = workspace
        self._temporary: tempfile.TemporaryDirectory | None = None
        self.workspace: Path | None = None
        self.command: list[str] = []
        self._process: subprocess.Popen | None = None
        self.python_env_dirs: list[Path] = []
        self._env_dirs_before: set[Path] = set()
        self._start_ticks: int | None = None
        self.last_cleanup: Cleanup | None = None  # what the last stop() removed
        self.fatal_signal_at_stop: str | None = None  # a crash signal in the log when stop() found it
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> TritonServer:
        if self._process is not None:
            raise StageError("this TritonServer was already started")
        repository = self.options.model_repository
        if not repository.is_dir():
            raise StageError(f"model repository {repository} does not exist")
        self._check_ports_free()
        installation = self._installation or find_tritonserver()
        self.workspace = self._make_workspace()
        served = self.workspace / "model_repository"
        if served.exists():
            shutil.rmtree(served)
        shutil.copytree(repository, served)
        backend_dir = make_backend_directory(installation, self.workspace / "backends")
        self.command = server_command(installation, self.options, model_repository=served, backend_dir=backend_dir)
        env_dirs_before = leaks.python_env_dirs()
        env = server_environment()
        env[process.MARK_ENV] = self.options.shm_prefix  # inherited by the stubs: marks them as this server's
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        # Not reaped yet (even if it exited at once), so /proc still shows its start time.
        self._start_ticks = process.start_time_ticks(self._process.pid)
        self._env_dirs_before = env_dirs_before
        return self

    def wait_until_ready(self, timeout: float = 120.0, *, require_all_ready: bool = True) -> dict[str, probe.ModelState]:
        """Block until the server answers and has loaded its models; the state of every model.

        Raises ToolError (command, exit code, log tail) if the server dies or times out, or, with
        `require_all_ready`, if a model is not READY.
        """
        process_ = self._require_started()
        deadline = time.monotonic() + timeout
        # The metrics endpoint starts a little after HTTP; ready means every endpoint answers.
        while not (probe.is_live(self.options.http_url) and probe.metrics_up(self.options.metrics_url)):
            if process_.poll() is not None:
                raise self._failure(f"tritonserver exited with code {process_.returncode} while starting", process_.returncode)
            if time.monotonic() > deadline:
                raise self._failure(f"tritonserver was not live after {timeout:.0f} s", -1)
            time.sleep(_READY_POLL_SECONDS)
        # HTTP comes up after the start-up loads finish, so the index is final here.
        others = leaks.server_start_times(exclude=(process_.pid,))
        self.python_env_dirs = leaks.not_owned_by_others(leaks.python_env_dirs() - self._env_dirs_before, others)
        states = probe.model_states(self.options.http_url)
        not_ready = {name: state for name, state in states.items() if not state.ready}
        if require_all_ready and not_ready:
            reasons = "; ".join(f"{name}: {state.state} {state.reason}".strip() for name, state in sorted(not_ready.items()))
            raise self._failure(f"models not ready: {reasons}", -1)
        return states

    def stop(self) -> int | None:
        """Stop the server and clean up after it; its exit code (None if it was never started).

        After a crash too: the stubs left in its process group are killed. StageError naming the
        pids if one of them cannot be ended (nothing else is removed then).
        """
        if self._process is None:
            return None
        process_ = self._process
        if self._stopped:  # stopped already: the same answer
            return process_.returncode
        crashed = process_.poll() is not None  # exited on its own before we asked
        if not crashed:
            process_.send_signal(signal.SIGTERM)
            try:
                process_.wait(self.options.exit_timeout_secs + _STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                # Our child, not yet reaped: its pid, hence its group id, cannot have been reused.
                process.kill_group(process_.pid)
                process_.wait()
        # Reaped now: only processes verifiably the server's are signalled. After a clean stop the
        # stubs get a moment to follow the server; a crashed server's stubs may be deadlocked.
        group = process.end_server_group(process_.pid, self._start_ticks, self.options.shm_prefix, wait=0.0 if crashed else 5.0)
        check_all_gone(group.failed, f"tritonserver (pid {process_.pid})", pgid=process_.pid)
        self.fatal_signal_at_stop = self.fatal_signal()  # read before a temporary workspace goes (with its log)
        self._stopped = True
        shm_regions, env_dirs = self._clean_up()
        self.last_cleanup = Cleanup(group=group, shm_regions=tuple(shm_regions), python_env_dirs=tuple(env_dirs))
        return process_.returncode

    def detach(self) -> None:
        """Forget the server without stopping it (it keeps running in its own session)."""
        if self._temporary is not None:
            raise StageError("a server in a temporary workspace cannot outlive this object; pass workspace= to detach it")
        self._process = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- facts -------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self._require_started().pid

    @property
    def log_path(self) -> Path:
        if self.workspace is None:
            raise StageError("the server has no workspace yet; call start() first")
        return self.workspace / LOG_NAME

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def fatal_signal(self) -> str | None:
        """The log's `Signal (N) received.` line for a crash signal (SIGSEGV, SIGABRT, ...), if any:
        the server is then dead, even when its process is still there, hung in its signal handler."""
        try:
            return fatal_signal_line(self.log_path)
        except StageError:  # not started
            return None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (FileNotFoundError, StageError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------------
    def _require_started(self) -> subprocess.Popen:
        if self._process is None:
            raise StageError("the server is not started; call start() first")
        return self._process

    def _make_workspace(self) -> Path:
        if self._given_workspace is not None:
            self._given_workspace.mkdir(parents=True, exist_ok=True)
            return self._given_workspace
        self._temporary = tempfile.TemporaryDirectory(prefix="trtllm-pipeline-serve-")
        return Path(self._temporary.name)

    def _check_ports_free(self) -> None:
        host = self.options.bind_address or "0.0.0.0"
        for name, port in (("http", self.options.http_port), ("grpc", self.options.grpc_port), ("metrics", self.options.metrics_port)):
            if probe.port_in_use(host, port):
                raise StageError(
                    f"{name} port {port} on {self.options.bind_address} is already in use",
                    hint="stop the other server (trtllm-pipeline stop) or choose other deploy ports",
                )

    def error_lines(self, limit: int = _LOG_ERROR_LINES) -> list[str]:
        """The log's error lines (`E…` records, 'failed to load' rows), where start-up failures are named."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except (FileNotFoundError, StageError):
            return []
        errors = [
            line
            for line in lines
            if (_ERROR_LINE.match(line) or "failed to load" in line or "UNAVAILABLE" in line) and not any(harmless in line for harmless in _HARMLESS_ERRORS)
        ]
        return errors[:limit]

    def _failure(self, what: str, returncode: int) -> ToolError:
        """Stop the server; a ToolError with its errors and last log lines (the log may go with it)."""
        errors = "\n".join(self.error_lines())
        tail = self.log_tail()
        try:
            self.stop()
        except StageError as error:  # keep the start-up failure as the error; add this to it
            what = f"{what}\n{error.message}"
        detail = (
            f"{what}\n--- server log: errors ---\n{errors}\n--- server log: last lines ---\n{tail}"
            if errors
            else f"{what}\n--- server log: last lines ---\n{tail}"
        )
        return ToolError(self.command, returncode, detail)

    def _clean_up(self) -> tuple[list[Path], list[Path]]:
        """Remove the server's shm regions, python_env directories and temporary workspace; what was removed."""
        shm_regions = leaks.remove_shm_regions(self.options.shm_prefix)
        # Without a ready server the new directories are not known for sure; only empty ones go.
        env_dirs = leaks.remove_empty_dirs(
            self.python_env_dirs or (leaks.python_env_dirs() - self._env_dirs_before), server_pid=self._process.pid if self._process else None
        )
        if self._temporary is not None:
            self._temporary.cleanup()
            self._temporary = None
        return shm_regions, env_dirs


def fatal_signal_line(log_path: Path) -> str | None:
    """`Signal (N) received` for a crash signal in the last 64 KiB of a tritonserver log, or None."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, 2) - _FATAL_SCAN_BYTES))
            tail = log.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    crashes = [signum for signum in received_signals(tail) if signum in CRASH_SIGNALS]
    return signal_line(crashes[0]) if crashes else None

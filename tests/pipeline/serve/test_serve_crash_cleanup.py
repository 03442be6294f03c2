"""After a tritonserver crash, `stop` and `serve` end what it left in its process group (issue 11).

A fake server: a `sh` leader in a new session (pid = process group id, like tritonserver started
with start_new_session=True) that starts a fake Python-backend stub (the real Python under the
name `triton_python_backend_stub`, so /proc shows the stub's comm, with the shm-region argument a
real stub gets) and waits. The leader is SIGKILLed, as a crash leaves it; the clean-up must end
the stub, say the server had exited, and keep the state file while something could not be ended.
Only processes that are verifiably the server's are signalled.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import PipelineError, StageError, ToolError
from pipeline.serve import ServerOptions, TritonInstallation, TritonServer, detached, foreground, leaks, process
from pipeline.serve.cleanup import crash_signal
from pipeline.serve.detached import LAST_LOG, STATE_FILE, ServerState, read_state, start_detached, stop_detached

PYTHON = os.path.realpath(sys.executable)
SLEEP_CODE = "import time; time.sleep(300)"


@pytest.fixture
def spawned():
    """The session leaders a test started (pid, start ticks): what is left of their groups is killed at
    the end, even if the test failed before it knew the members (members that started after the
    leader; the group id cannot have been reused while they live)."""
    started: list[tuple[int, int]] = []
    yield started
    for pid, ticks in started:
        for member in process.group_members(pid):
            if member.start_ticks >= ticks:
                process.kill_if_same(member.pid, member.start_ticks)
        process.kill_if_same(pid, ticks)


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def members_once(pgid: int, count: int, *, stub: bool = False) -> list | None:
    """The group's members once there are `count` of them (one a stub, if asked): None before."""
    members = process.group_members(pgid)
    if len(members) == count and (not stub or any(p.is_stub for p in members)):
        return members
    return None


def alive(pid: int, ticks: int) -> bool:
    return process.is_same_process(pid, ticks)


class FakeServer:
    """A session leader with a fake stub (and optionally a child without any mark) in its group."""

    def __init__(
        self,
        state_dir: Path,
        spawned: list,
        *,
        marker: str,
        mark_stub: bool = True,
        unmarked_child: bool = False,
        crash_log: str = "Signal (11) received.\n 0# 0x000056210179252D in tritonserver\n",
        stub_dir: Path | None = None,
    ) -> None:
        self.workspace = state_dir / detached.WORKSPACE_DIR
        self.workspace.mkdir(parents=True)
        stub_dir = stub_dir or self.workspace / "backends" / "python"  # where a real server's stubs run from
        stub_dir.mkdir(parents=True)
        stub = stub_dir / process.STUB_NAME
        stub.symlink_to(PYTHON)
        self.log = self.workspace / "tritonserver.log"
        self.log.write_text('I1201 10:21:47.950796 7270 http_server.cc:4713] "Started HTTPService at 127.0.0.1:8000"\n' + crash_log)
        region_arg = f"{marker}72a4c51a-d853-4ae6-bdfc-4c450f276b71" if mark_stub else "no-region"
        script = f'"{stub}" -c "{SLEEP_CODE}" {region_arg} 1048576 &\n' + ("sleep 300 &\n" if unmarked_child else "") + "wait\n"
        self.leader = subprocess.Popen(["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL)
        self.pid = self.leader.pid
        self.ticks = process.start_time_ticks(self.pid)
        spawned.append((self.pid, self.ticks))
        expected = 2 + unmarked_child
        self.members = wait_for(lambda: members_once(self.pid, expected, stub=True))
        [self.stub] = [m for m in self.members if m.is_stub]
        self.others = [m for m in self.members if m.pid not in (self.pid, self.stub.pid)]
        self.marker = marker

    def crash(self) -> None:
        """SIGKILL the leader only, as a crash does; its stub keeps running."""
        os.kill(self.pid, signal.SIGKILL)
        self.leader.wait()

    def state(self, state_dir: Path, *, python_env_dirs: list[Path] = ()) -> ServerState:
        state = ServerState(
            pid=self.pid,
            start_ticks=self.ticks,
            command=["tritonserver"],
            http_url="http://127.0.0.1:18000",
            grpc_url="127.0.0.1:18001",
            metrics_url="http://127.0.0.1:18002/metrics",
            log_path=str(self.log),
            shm_prefix=self.marker,
            python_env_dirs=[str(p) for p in python_env_dirs],
            exit_timeout_secs=1,
            workspace=str(self.workspace),
            model_repository=str(state_dir / "repo"),
            started_at="2026-12-01T10:21:45Z",
        )
        detached._write_state(state_dir, state)
        return state


@pytest.fixture
def marker():
    """A shm prefix of this test's own; its /dev/shm regions are removed at the end whatever happens."""
    prefix = f"triton_python_backend_shm_region_trtllmpipe_test{secrets.token_hex(4)}_"
    yield prefix
    leaks.remove_shm_regions(prefix)


def old_empty_dir(parent: Path) -> Path:
    """An empty python_env directory created long ago: no live server can own it."""
    directory = parent / f"python_env_{secrets.token_hex(3)}"
    directory.mkdir()
    old = time.time() - 10 * 86400
    os.utime(directory, (old, old))
    return directory


# -- stop after a crash ---------------------------------------------------------------------------
def test_stop_after_a_crash_kills_the_stub_and_says_the_server_had_exited(tmp_path, spawned, marker):
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker)
    region = leaks.SHM_DIR / f"{marker}72a4c51a-d853-4ae6-bdfc-4c450f276b71"
    region.write_bytes(b"\0" * 16)
    env_dir = old_empty_dir(tmp_path)
    server.state(state_dir, python_env_dirs=[env_dir])
    server.crash()
    assert alive(server.stub.pid, server.stub.start_ticks) and not alive(server.pid, server.ticks)

    result = stop_detached(state_dir)

    assert not alive(server.stub.pid, server.stub.start_ticks), "the stub of the crashed server survived"
    assert not process.group_alive(server.pid)
    assert result.already_exited and result.pid == server.pid and result.crash_signal == 11
    assert [p.pid for p in result.cleanup.killed] == [server.stub.pid]
    message = result.message()
    assert message.startswith(
        f"the server (pid {server.pid}) that served http://127.0.0.1:18000 had already exited: it crashed (signal 11, SIGSEGV); see {state_dir / LAST_LOG}"
    )
    assert f"killed 1 Python-backend stub (pid {server.stub.pid};" in message and " MB RSS)" in message
    assert "removed 1 shared-memory region, removed 1 python_env directory" in message
    assert not region.exists() and not env_dir.exists()
    assert read_state(state_dir) is None and (state_dir / LAST_LOG).is_file() and not server.workspace.exists()
    with pytest.raises(PipelineError, match="no server is recorded"):
        stop_detached(state_dir)


def test_stop_after_a_kill_without_a_crash_line_says_only_that_it_had_exited(tmp_path, spawned, marker):
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker, crash_log="")
    server.state(state_dir)
    server.crash()
    message = stop_detached(state_dir).message()
    assert message.startswith(f"the server (pid {server.pid}) that served http://127.0.0.1:18000 had already exited; see ")
    assert "crashed" not in message
    assert not alive(server.stub.pid, server.stub.start_ticks)


def test_a_member_without_the_mark_goes_with_a_marked_one(tmp_path, spawned, marker):
    """The group still holds the marked stub, so its id was not reused: the unmarked child is the server's too."""
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker, unmarked_child=True)
    server.state(state_dir)
    server.crash()
    result = stop_detached(state_dir)
    [other] = server.others
    assert not alive(other.pid, other.start_ticks) and not alive(server.stub.pid, server.stub.start_ticks)
    pids = f"{min(server.stub.pid, other.pid)}, {max(server.stub.pid, other.pid)}"
    assert f"killed 2 processes: 1 Python-backend stub and 1 other (pids {pids};" in result.message()
    assert "MB RSS in total" in result.message()


def test_a_group_without_any_marked_member_is_left_alone(tmp_path, spawned, marker):
    """Nothing in the group carries the server's mark: the id may have been reused, nothing is signalled."""
    state_dir = tmp_path / "serve"
    # Its stub does not run from the workspace either (that alone would make it an earlier server's).
    server = FakeServer(state_dir, spawned, marker=marker, mark_stub=False, stub_dir=tmp_path / "elsewhere")
    server.state(state_dir)
    server.crash()
    result = stop_detached(state_dir)
    assert alive(server.stub.pid, server.stub.start_ticks), "an unverified process was signalled"
    assert not result.cleanup.killed
    assert f"left alone pid {server.stub.pid}: in process group {server.pid} but not verifiably this server's" in result.message()
    assert read_state(state_dir) is None  # not ours: nothing to retry


def test_the_environment_mark_identifies_a_member(tmp_path, spawned, marker):
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True, env={**os.environ, process.MARK_ENV: marker})
    ticks = process.start_time_ticks(leader.pid)
    spawned.append((leader.pid, ticks))
    [_, child] = wait_for(lambda: members_once(leader.pid, 2))
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    assert process.server_group(leader.pid, ticks, "some_other_prefix_")[0] == []
    cleanup = process.end_server_group(leader.pid, ticks, marker)
    assert [p.pid for p in cleanup.killed] == [child.pid] and not alive(child.pid, child.start_ticks)


def test_the_state_file_stays_while_a_process_cannot_be_ended(tmp_path, spawned, marker, monkeypatch):
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker)
    state = server.state(state_dir)
    server.crash()
    monkeypatch.setattr(process, "kill_if_same", lambda pid, ticks, signum=signal.SIGKILL: False)  # e.g. stuck in D state
    monkeypatch.setattr(process, "KILL_GRACE_S", 0.2)
    with pytest.raises(StageError) as raised:
        stop_detached(state_dir)
    assert f"could not end 1 process of the server (pid {server.pid})" in raised.value.message
    assert f"pid {server.stub.pid} (triton_python_b)" in raised.value.message
    assert f"{state_dir / STATE_FILE} is kept" in raised.value.message
    assert read_state(state_dir) == state and server.log.is_file(), "cleaned up although the stub still runs"
    monkeypatch.undo()
    result = stop_detached(state_dir)  # the rerun finishes the job
    assert result.already_exited and not alive(server.stub.pid, server.stub.start_ticks) and read_state(state_dir) is None


def test_a_normal_stop_keeps_the_short_message(tmp_path, spawned, marker):
    state_dir = tmp_path / "serve"
    workspace = state_dir / detached.WORKSPACE_DIR
    workspace.mkdir(parents=True)
    leader = subprocess.Popen(["sleep", "300"], start_new_session=True)  # exits at SIGTERM, leaves nothing
    ticks = process.start_time_ticks(leader.pid)
    spawned.append((leader.pid, ticks))
    detached._write_state(
        state_dir,
        ServerState(
            pid=leader.pid,
            start_ticks=ticks,
            command=["sleep"],
            http_url="http://127.0.0.1:18000",
            grpc_url="",
            metrics_url="",
            log_path=str(workspace / "tritonserver.log"),
            shm_prefix=marker,
            python_env_dirs=[],
            exit_timeout_secs=1,
            workspace=str(workspace),
            model_repository="",
            started_at="",
        ),
    )
    result = stop_detached(state_dir)
    assert result.message() == f"stopped the server (pid {leader.pid}) that served http://127.0.0.1:18000"
    assert not result.already_exited and not alive(leader.pid, ticks) and read_state(state_dir) is None


# -- serve after a crash --------------------------------------------------------------------------
class _Started(Exception):
    pass


def never_started(*args, **kwargs):
    raise _Started


def test_serve_detached_cleans_the_stale_group_first_and_reports_it(tmp_path, spawned, marker, monkeypatch):
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker)
    server.state(state_dir)
    server.crash()
    seen = []

    def fake_start(*args, **kwargs):  # the new server would start here
        seen.append(("started", alive(server.stub.pid, server.stub.start_ticks), read_state(state_dir)))
        raise _Started

    monkeypatch.setattr(detached, "TritonServer", fake_start)
    with pytest.raises(_Started):
        start_detached(ServerOptions(model_repository=tmp_path), state_dir, on_cleanup=lambda result: seen.append(result.message()))
    [report, started] = seen
    assert report.startswith(f"the server (pid {server.pid}) that served http://127.0.0.1:18000 had already exited: it crashed (signal 11")
    assert f"killed 1 Python-backend stub (pid {server.stub.pid};" in report
    assert started == ("started", False, None), "the new server would have started beside the old stub"


def test_stubs_of_a_server_whose_state_was_lost_are_found_in_the_workspace(tmp_path, spawned, marker, monkeypatch):
    """What the old `stop` left: the state file deleted, the stub still running from the workspace."""
    state_dir = tmp_path / "serve"
    server = FakeServer(state_dir, spawned, marker=marker)
    server.crash()
    assert read_state(state_dir) is None
    # A live server's stub from the same workspace is not an orphan.
    live = FakeServer(tmp_path / "other", spawned, marker=marker)
    assert [p.pid for p in process.orphaned_stubs(live.workspace)] == []
    result = stop_detached(state_dir)
    assert not alive(server.stub.pid, server.stub.start_ticks) and alive(live.stub.pid, live.stub.start_ticks)
    assert re.fullmatch(
        rf"no server is recorded in {re.escape(str(state_dir / STATE_FILE))}; killed 1 Python-backend stub \(pid {server.stub.pid}; "
        r"\d+ MB RSS\) of an earlier server whose state was lost",
        result.message(),
    ), result.message()

    again = FakeServer(tmp_path / "again", spawned, marker=marker)
    again.crash()
    reports = []
    monkeypatch.setattr(detached, "TritonServer", never_started)
    with pytest.raises(_Started):
        start_detached(ServerOptions(model_repository=tmp_path), tmp_path / "again", on_cleanup=lambda r: reports.append(r.message()))
    assert not alive(again.stub.pid, again.stub.start_ticks)
    assert len(reports) == 1 and "of an earlier server whose state was lost" in reports[0]


# -- a foreground server (TritonServer.stop) that crashed -----------------------------------------
def free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def test_triton_server_stop_after_a_crash_kills_what_the_server_left(tmp_path, spawned):
    """The stub-like child carries only the environment mark TritonServer gives the server."""
    root = tmp_path / "fake-tritonserver"
    (root / "bin").mkdir(parents=True)
    fake = root / "bin" / "tritonserver"
    child_file = tmp_path / "child.pid"
    fake.write_text(f"#!/bin/sh\nulimit -c 0\nsleep 300 &\necho $! > {child_file}\nsleep 0.2\nkill -SEGV $$\n")
    fake.chmod(0o755)
    repository = tmp_path / "repo"
    repository.mkdir()
    http_port, grpc_port, metrics_port = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    triton = TritonServer(options, installation=TritonInstallation(root)).start()
    spawned.append((triton.pid, process.start_time_ticks(triton.pid)))
    child_pid = int(wait_for(lambda: child_file.is_file() and child_file.read_text().strip()))
    child_ticks = process.start_time_ticks(child_pid)
    wait_for(lambda: not triton.is_running())

    error = foreground._exited_on_its_own(triton)

    assert isinstance(error, ToolError) and error.returncode == -signal.SIGSEGV
    assert "tritonserver exited on its own: it crashed (signal 11, SIGSEGV)" in error.message
    assert f"cleaned up: killed 1 process (pid {child_pid};" in error.message
    assert not alive(child_pid, child_ticks) and not process.group_alive(triton.pid)


def test_crash_signal_is_the_last_one_the_log_names(tmp_path):
    log = tmp_path / "tritonserver.log"
    assert crash_signal(log) is None  # no log
    log.write_text("I1201 started\nSignal (6) received.\n 0# ...\nSignal (11) received.\n")
    assert crash_signal(log) == 11
    log.write_text("I1201 started\nE1201 error: Signal (11) received in a message\n")
    assert crash_signal(log) is None


def test_a_crash_signal_in_the_log_marks_the_server_dead_even_if_its_process_lives(tmp_path):
    """After heap corruption tritonserver prints "Signal (6) received." and can hang in its handler."""
    from pipeline.serve.server import fatal_signal_line

    log = tmp_path / "tritonserver.log"
    assert fatal_signal_line(log) is None
    log.write_text("I1201 started\nSignal (15) received.\n")  # a requested stop is not a crash
    assert fatal_signal_line(log) is None
    log.write_text("I1201 started\nmalloc(): unaligned tcache chunk detected\nSignal (6) received.\n" + "x" * 70000)
    assert fatal_signal_line(log) is None  # only the last 64 KiB are read...
    log.write_text("x" * 70000 + "\nmalloc(): unaligned tcache chunk detected\nSignal (6) received.\n")
    assert fatal_signal_line(log) == "Signal (6) received"  # ...where a crash that just happened is

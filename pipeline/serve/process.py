"""Process handling for a server started in its own process group (Linux /proc)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_POLL_SECONDS = 0.1


def start_time_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot), or None if there is no such process.

    Stored with a pid so that a later `stop` never signals an unrelated process that reused it.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def is_same_process(pid: int, ticks: int) -> bool:
    return start_time_ticks(pid) == ticks and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] == "Z"


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in the group.

    Zombies count as gone: a killed server's orphaned stubs are reparented to PID 1, which in a
    container may never reap them.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def signal_process(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def wait_until(condition, timeout: float) -> bool:
    """Poll `condition()` until it is true or `timeout` seconds pass; whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_SECONDS)


def kill_group(pgid: int, grace: float = 5.0) -> None:
    """SIGKILL every process of the group (server and Python stubs) and wait for them to go."""
    signal_group(pgid, signal.SIGKILL)
    wait_until(lambda: not group_alive(pgid), grace)


def reap_if_child(pid: int) -> None:
    """Collect the exit status of `pid` if it is our own child (a zombie otherwise lingers)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# -- what a server leaves in its process group --------------------------------------------------
# The tritonserver is started with start_new_session=True: its pid is also its process group and
# session id, and every Python-backend stub it forks is in that group. A crashed server can leave
# its stubs running (deadlocked, hundreds of MB each); they are found and ended from /proc here.
#
# Which processes are the server's (the only ones ever signalled):
#   a process is the server's if its process group id is the server's pid, it did not start before
#   the server, and
#   1. it is the server itself (same pid and start time), or
#   2. it carries the server's mark: `MARK_ENV=<marker>` in its environment (set for the server,
#      inherited by everything it starts) or `<marker>` in its command line (every stub gets its
#      shared-memory region `<shm prefix><uuid>` as an argument, also for servers started before
#      the environment mark existed). The marker is the server's random shm prefix.
#   Other members of the group (a stub's own child without the mark, say) are the server's too as
#   long as a marked member is still alive after the scan: a process group id is reused only after
#   every member of the group has exited, so a group that still holds a marked member is the
#   server's group. If no marked member is left, the id may have been reused and the members are
#   left alone.
#   A process is signalled through a pidfd that is checked against the start time seen in the
#   scan, so a pid reused in between is never signalled.
MARK_ENV = "TRTLLM_PIPELINE_SERVER"
STUB_COMM = "triton_python_b"  # /proc/<pid>/comm holds 15 characters of triton_python_backend_stub
STUB_NAME = "triton_python_backend_stub"
_PROC = Path("/proc")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
KILL_GRACE_S = 5.0  # how long a SIGKILLed process may take to go before it counts as not ended


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    comm: str
    state: str
    pgid: int
    start_ticks: int
    rss_bytes: int

    @property
    def is_stub(self) -> bool:
        return self.comm == STUB_COMM

    @property
    def rss_mb(self) -> float:
        return self.rss_bytes / 2**20


@dataclass(frozen=True)
class GroupCleanup:
    """What `end_server_group` found in the server's process group and did with it."""

    pgid: int
    exited: tuple[ProcessInfo, ...] = ()  # went on their own while we waited
    killed: tuple[ProcessInfo, ...] = ()  # SIGKILLed and gone
    failed: tuple[ProcessInfo, ...] = ()  # still alive (or not ours to signal) after SIGKILL
    left_alone: tuple[ProcessInfo, ...] = ()  # in a group with the same id, not verifiably the server's

    @property
    def killed_stubs(self) -> tuple[ProcessInfo, ...]:
        return tuple(p for p in self.killed if p.is_stub)

    @property
    def killed_rss_mb(self) -> float:
        return sum(p.rss_bytes for p in self.killed) / 2**20


def read_process(pid: int) -> ProcessInfo | None:
    """The process's facts from /proc/<pid>/stat, or None if there is no such process."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessInfo(pid=pid, comm=comm, state=fields[0], pgid=int(fields[2]), start_ticks=int(fields[19]), rss_bytes=int(fields[21]) * _PAGE_SIZE)


def group_members(pgid: int) -> list[ProcessInfo]:
    """The live (non-zombie) processes whose process group id is `pgid`."""
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = read_process(int(entry.name))
        if info is not None and info.pgid == pgid and info.state not in ("Z", "X"):
            members.append(info)
    return sorted(members, key=lambda p: p.pid)


def _argv(pid: int) -> list[str]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def _has_mark(pid: int, marker: str) -> bool:
    if not marker:
        return False
    if any(marker in arg for arg in _argv(pid)):
        return True
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{MARK_ENV}={marker}".encode() in environ.split(b"\0")


def server_group(pid: int, start_ticks: int | None, marker: str) -> tuple[list[ProcessInfo], list[ProcessInfo]]:
    """The live members of the server's process group: (the server's, others') by the rule above."""
    found = group_members(pid)
    members = [p for p in found if start_ticks is None or p.start_ticks >= start_ticks]
    strangers = [p for p in found if p not in members]
    marked = [p for p in members if (p.pid == pid and p.start_ticks == start_ticks) or _has_mark(p.pid, marker)]
    # Still there after the scan: the group existed all along, so every member seen is the server's.
    if any(is_same_process(p.pid, p.start_ticks) for p in marked):
        return members, strangers
    return [], members + strangers


def kill_if_same(pid: int, start_ticks: int, signum: int = signal.SIGKILL) -> bool:
    """Send `signum` to `pid` only if it is still the process that started at `start_ticks`."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd (old kernel): check, then signal at once
        if start_time_ticks(pid) != start_ticks:
            return False
        signal_process(pid, signum)
        return True
    try:
        # The pidfd refers to one process for good: if the pid still shows the start time seen in
        # the scan, that process is the one the pidfd refers to.
        if start_time_ticks(pid) != start_ticks:
            return False
        signal.pidfd_send_signal(handle, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(handle)


def end_server_group(pid: int, start_ticks: int | None, marker: str, *, wait: float = 0.0, grace: float | None = None) -> GroupCleanup:
    """End whatever is left of the server's process group (the server too, if it still runs).

    Members get `wait` seconds to exit on their own (after a clean stop the stubs follow the server
    within moments), then SIGKILL and `grace` seconds (KILL_GRACE_S) to go. Only processes that are verifiably the
    server's are signalled (see the rule above).
    """
    ours, strangers = server_group(pid, start_ticks, marker)
    exited: list[ProcessInfo] = []
    if ours and wait > 0:
        wait_until(lambda: not any(_alive(p) for p in ours), wait)
        alive = {p.pid: _alive(p) for p in ours}
        exited = [p for p in ours if not alive[p.pid]]
        ours = [p for p in ours if alive[p.pid]]
    killed, failed = kill_processes(ours, grace)
    return GroupCleanup(pgid=pid, exited=tuple(exited), killed=tuple(killed), failed=tuple(failed), left_alone=tuple(strangers))


def _alive(member: ProcessInfo) -> bool:
    reap_if_child(member.pid)
    return is_same_process(member.pid, member.start_ticks)


def orphaned_stubs(workspace: Path) -> list[ProcessInfo]:
    """Python-backend stubs started from `workspace` whose server (their group leader) is gone.

    A detached server's stubs run `<workspace>/backends/python/triton_python_backend_stub`, and
    only servers started for that state directory use its workspace; a stub is in its server's
    group, whose id is the server's pid and cannot be reused while the stub lives. So a stub from
    this workspace whose group leader is not alive belongs to a server of ours that died.
    """
    prefix = str(workspace).rstrip("/") + "/"
    orphans = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = read_process(int(entry.name))
        if info is None or not info.is_stub or info.state in ("Z", "X"):
            continue
        argv = _argv(info.pid)
        if not argv or not argv[0].startswith(prefix) or Path(argv[0]).name != STUB_NAME:
            continue
        leader = read_process(info.pgid)
        if leader is None or leader.state in ("Z", "X") or leader.pgid != info.pgid:
            orphans.append(info)
    return sorted(orphans, key=lambda p: p.pid)


def kill_processes(processes: list[ProcessInfo], grace: float | None = None) -> tuple[list[ProcessInfo], list[ProcessInfo]]:
    """SIGKILL each that is still the same process; (gone, still alive or not ours to signal)."""
    if not processes:
        return [], []
    refused = []
    for member in processes:
        try:
            kill_if_same(member.pid, member.start_ticks)
        except PermissionError:
            refused.append(member)
    wait_until(lambda: not any(_alive(p) for p in processes), KILL_GRACE_S if grace is None else grace)
    failed = [p for p in processes if p in refused or _alive(p)]
    return [p for p in processes if p not in failed], failed

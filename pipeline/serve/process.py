"""Process handling for a server started in its own process group (Linux /proc)."""

from __future__ import annotations

import os
import signal
import time
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

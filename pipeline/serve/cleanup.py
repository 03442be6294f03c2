"""What was cleaned up after a server, in words: for `stop`, `serve --detach` and a foreground server.

The library returns these facts; the CLI prints them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError
from pipeline.serve.process import GroupCleanup, ProcessInfo

# tritonserver's own crash handler prints this (then a backtrace) on SIGSEGV, SIGABRT, ...; its
# SIGTERM/SIGINT handler prints it too, for a requested stop.
_SIGNAL_LINE = re.compile(r"^Signal \((\d+)\) received", re.MULTILINE)
# Signals after which tritonserver is dead even if its process is not: its handler prints a stack
# trace, which allocates, and after heap corruption it can block on malloc's lock for ever.
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})


def received_signals(log_text: str) -> list[int]:
    """The signals a tritonserver log says it received, in order."""
    return [int(number) for number in _SIGNAL_LINE.findall(log_text)]


def signal_line(signum: int) -> str:
    """How the log says it: `Signal (6) received`."""
    return f"Signal ({signum}) received"


def crash_signal(log: Path | None) -> int | None:
    """The signal the server's log says it received last (`Signal (11) received.`), if any."""
    if log is None:
        return None
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = received_signals(text)
    return found[-1] if found else None


def signal_text(signum: int) -> str:
    try:
        return f"signal {signum}, {signal.Signals(signum).name}"
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class Cleanup:
    """What was removed after a server: its leftover processes, shm regions, python_env directories."""

    group: GroupCleanup
    shm_regions: tuple[Path, ...] = ()
    python_env_dirs: tuple[Path, ...] = ()
    orphans: tuple[ProcessInfo, ...] = ()  # stubs of earlier servers of the same workspace, killed

    @property
    def killed(self) -> tuple[ProcessInfo, ...]:
        return self.group.killed + self.orphans

    def summary(self) -> str:
        """`killed 1 Python-backend stub (pid 7298; 405 MB RSS), removed 2 shared-memory regions`; empty if nothing."""
        parts = []
        if self.group.killed:
            parts.append(f"killed {_processes(self.group.killed)}")
        if self.orphans:
            parts.append(f"killed {_processes(self.orphans)} of an earlier server whose state was lost")
        if self.shm_regions:
            parts.append(f"removed {_count(len(self.shm_regions), 'shared-memory region')}")
        if self.python_env_dirs:
            parts.append(f"removed {_count(len(self.python_env_dirs), 'python_env directory', 'python_env directories')}")
        if self.group.left_alone:
            pids = ", ".join(str(p.pid) for p in self.group.left_alone)
            parts.append(f"left alone pid {pids}: in process group {self.group.pgid} but not verifiably this server's")
        return ", ".join(parts)


def check_all_gone(failed: Sequence[ProcessInfo], what: str, *, pgid: int | None = None, keeps: str = "") -> None:
    """StageError naming the pids that could not be ended (the caller cleans nothing else then)."""
    if failed:
        pids = ", ".join(f"{p.pid} ({p.comm})" for p in failed)
        group = f" (process group {pgid})" if pgid else ""
        raise StageError(
            f"could not end {_count(len(failed), 'process', 'processes')} of {what}{group}: pid {pids}" + (f"; {keeps}" if keeps else ""),
            hint=f"end them by hand (kill -KILL {' '.join(str(p.pid) for p in failed)}) or run the command again",
        )


def _processes(processes: tuple[ProcessInfo, ...]) -> str:
    """`1 Python-backend stub (pid 7298; 405 MB RSS)`, `3 processes: 2 Python-backend stubs and 1 other (pids …)`."""
    stubs = sum(p.is_stub for p in processes)
    others = len(processes) - stubs
    if not others:
        noun = _count(stubs, "Python-backend stub")
    elif not stubs:
        noun = _count(others, "process", "processes")
    else:
        noun = f"{_count(len(processes), 'process', 'processes')}: {_count(stubs, 'Python-backend stub')} and {others} other"
    pids = ", ".join(str(p.pid) for p in processes)
    rss = sum(p.rss_bytes for p in processes) / 2**20
    many = len(processes) > 1
    return f"{noun} ({'pids' if many else 'pid'} {pids}; {rss:.0f} MB RSS{' in total' if many else ''})"


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"

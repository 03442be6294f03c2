"""What a tritonserver may leave behind after an abnormal exit, and how to remove only its own.

- `/dev/shm/<shm prefix><uuid>`: one region per Python-model instance. Each server gets a unique
  prefix (`--backend-config=python,shm-region-prefix-name=...`), so its regions are known exactly.
- `/tmp/python_env_XXXXXX`: created by the Python backend at start-up (TMPDIR is ignored), removed
  on a clean exit. A server's own directories are the ones that appeared while it started and
  that no other live tritonserver may have created (see `not_owned_by_others`); they are removed
  only if empty. The directory stays empty while its server runs, and a server whose directory
  was removed under it aborts at exit (`fts_read error: /tmp/python_env_… No such file or
  directory`, SIGABRT), so a directory that may belong to another server is never removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PYTHON_ENV_GLOB = "python_env_*"
PYTHON_ENV_DIR = Path("/tmp")
PROC_DIR = Path("/proc")
SERVER_COMM = "tritonserver"
# A server creates its python_env directory when its Python backend initializes: moments after it
# starts (the first Python model loads at once). Generous, for a loaded machine.
CREATION_WINDOW_S = 60.0
_CLOCK_SLACK_S = 1.0  # process start times are in clock ticks; file times are not


def python_env_dirs() -> set[Path]:
    return set(PYTHON_ENV_DIR.glob(PYTHON_ENV_GLOB))


def server_start_times(exclude: Iterable[int] = ()) -> list[float]:
    """When each live tritonserver process (other than the pids in `exclude`) started, as epoch seconds."""
    excluded = set(exclude)
    try:
        boot = next(float(line.split()[1]) for line in (PROC_DIR / "stat").read_text().splitlines() if line.startswith("btime "))
    except (OSError, StopIteration):
        return []
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    starts = []
    for stat_file in PROC_DIR.glob("[0-9]*/stat"):
        try:
            pid = int(stat_file.parent.name)
            if pid in excluded or (stat_file.parent / "comm").read_text().strip() != SERVER_COMM:
                continue
            stat = stat_file.read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            starts.append(boot + int(fields[19]) / ticks_per_second)
    return starts


def not_owned_by_others(directories: Iterable[Path], other_server_starts: Iterable[float]) -> list[Path]:
    """The python_env directories no other live server can have created: none of them started shortly
    before the directory appeared. When servers start together, none of their directories qualifies."""
    starts = list(other_server_starts)
    kept = []
    for directory in sorted(directories):
        try:
            status = directory.stat()
        except OSError:
            continue
        created = min(status.st_ctime, status.st_mtime)  # an empty directory keeps its creation time
        if not any(start - _CLOCK_SLACK_S <= created <= start + CREATION_WINDOW_S for start in starts):
            kept.append(directory)
    return kept


def remove_shm_regions(prefix: str) -> list[Path]:
    removed: list[Path] = []
    if not prefix:  # never glob the whole of /dev/shm
        return removed
    for region in SHM_DIR.glob(f"{prefix}*"):
        try:
            region.unlink()
            removed.append(region)
        except FileNotFoundError:
            continue
    return removed


def remove_empty_dirs(directories: Iterable[Path], *, server_pid: int | None = None) -> list[Path]:
    """Remove those of `directories` that are empty and that no live tritonserver other than
    `server_pid` may own (an empty python_env directory may be another running server's)."""
    removed = []
    others = server_start_times(exclude=() if server_pid is None else (server_pid,))
    for directory in not_owned_by_others(directories, others):
        try:
            os.rmdir(directory)
            removed.append(directory)
        except FileNotFoundError:
            continue
        except OSError:  # not empty: not ours to delete
            continue
    return removed

"""Leak clean-up never removes another running server's python_env directory (pipeline.serve.leaks).

An empty /tmp/python_env_* directory may be a live server's: removing it makes that server abort at
exit. Ownership is decided from process start times in /proc (a fake /proc here) and directory times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.serve import leaks

BOOT = 1_700_000_000.0
HZ = os.sysconf("SC_CLK_TCK")


def fake_proc(root: Path, processes: dict[int, tuple[str, float, str]]) -> Path:
    """/proc with `btime` and, per pid, `comm` and a `stat` whose field 22 is the start time in ticks."""
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {int(BOOT)}\nprocesses 9\n")
    for pid, (comm, started, state) in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "comm").write_text(comm + "\n")
        ticks = round((started - BOOT) * HZ)
        fields = [state, "1", str(pid), "0"] + ["0"] * 15 + [str(ticks)] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    return root


def env_dir(parent: Path, name: str, created: float) -> Path:
    directory = parent / f"python_env_{name}"
    directory.mkdir()
    os.utime(directory, (created, created))  # mtime; ctime is now, later than mtime here
    return directory


def test_server_start_times_lists_live_tritonservers_only(tmp_path, monkeypatch):
    proc = fake_proc(
        tmp_path / "proc",
        {
            10: ("tritonserver", BOOT + 100.0, "S"),
            11: ("tritonserver", BOOT + 200.0, "Z"),  # a zombie has exited
            12: ("python", BOOT + 300.0, "S"),
            13: ("tritonserver", BOOT + 400.0, "R"),
        },
    )
    monkeypatch.setattr(leaks, "PROC_DIR", proc)
    assert sorted(leaks.server_start_times()) == pytest.approx([BOOT + 100.0, BOOT + 400.0], abs=0.02)
    assert leaks.server_start_times(exclude=[13]) == pytest.approx([BOOT + 100.0], abs=0.02)


def test_a_directory_created_just_after_another_server_started_is_not_ours(tmp_path):
    other_start = BOOT + 1000.0
    theirs = env_dir(tmp_path, "theirs", other_start + 0.8)  # created while the other server started
    old = env_dir(tmp_path, "old", other_start - 300.0)  # before it started: not its
    late = env_dir(tmp_path, "late", other_start + leaks.CREATION_WINDOW_S + 30.0)  # long after its start-up
    assert leaks.not_owned_by_others([theirs, old, late], [other_start]) == [late, old]
    assert leaks.not_owned_by_others([theirs, old, late], []) == [late, old, theirs]
    assert leaks.not_owned_by_others([tmp_path / "python_env_gone"], []) == []


def test_remove_empty_dirs_spares_other_servers_and_non_empty_dirs(tmp_path, monkeypatch):
    now = BOOT + 5000.0
    proc = fake_proc(tmp_path / "proc", {20: ("tritonserver", now - 2.0, "S"), 21: ("tritonserver", now - 500.0, "S")})
    monkeypatch.setattr(leaks, "PROC_DIR", proc)
    envs = tmp_path / "tmp"
    envs.mkdir()
    running = env_dir(envs, "running", now - 1.0)  # server 20's: created one second after it started
    leftover = env_dir(envs, "leftover", now - 200.0)  # nobody alive started just before it
    full = env_dir(envs, "full", now - 200.0)
    (full / "file").write_text("x")
    os.utime(full, (now - 200.0, now - 200.0))
    assert leaks.remove_empty_dirs([running, leftover, full]) == [leftover]
    assert running.is_dir() and full.is_dir() and not leftover.exists()
    # The stopped server's own pid does not protect its directory.
    assert leaks.remove_empty_dirs([running], server_pid=20) == [running]

"""What a tritonserver may leave behind after an abnormal exit, and how to remove only its own.

- `/dev/shm/<shm prefix><uuid>`: one region per Python-model instance. Each server gets a unique
  prefix (`--backend-config=python,shm-region-prefix-name=...`), so its regions are known exactly.
- `/tmp/python_env_XXXXXX`: created by the Python backend at start-up (TMPDIR is ignored), removed
  on a clean exit. A server's own directories are the ones that appeared while it started; they
  are removed only if empty, so a directory that belongs to someone else is never destroyed.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PYTHON_ENV_GLOB = "python_env_*"
PYTHON_ENV_DIR = Path("/tmp")


def python_env_dirs() -> set[Path]:
    return set(PYTHON_ENV_DIR.glob(PYTHON_ENV_GLOB))


def remove_shm_regions(prefix: str) -> list[Path]:
    removed = []
    if not prefix:  # never glob the whole of /dev/shm
        return removed
    for region in SHM_DIR.glob(f"{prefix}*"):
        try:
            region.unlink()
            removed.append(region)
        except FileNotFoundError:
            continue
    return removed


def remove_empty_dirs(directories: list[Path] | set[Path]) -> list[Path]:
    removed = []
    for directory in sorted(directories):
        try:
            os.rmdir(directory)
            removed.append(directory)
        except FileNotFoundError:
            continue
        except OSError:  # not empty: not ours to delete
            continue
    return removed

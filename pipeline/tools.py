"""The seam to the outside world: installed tool versions, and running external commands."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from pipeline.errors import ToolError

# Distribution name → the short name used in manifests.
_TRACKED = {
    "trtllm-pipeline": "trtllm_pipeline",
    "torch": "torch",
    "nvidia-modelopt": "modelopt",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "nvidia-pytriton": "pytriton",
    "tritonclient": "tritonclient",
}


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of the Python packages whose behaviour shapes an artifact (`"absent"` if not installed)."""
    versions = {}
    for dist, short in _TRACKED.items():
        try:
            versions[short] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[short] = "absent"
    return versions


def run_command(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    """Run `command`; return its stdout. On failure raise ToolError with the exit code and the tail of stderr."""
    try:
        done = subprocess.run(command, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ToolError(command, 127, f"{command[0]}: command not found", hint=f"install {command[0]} or put it on PATH") from None
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        raise ToolError(command, -1, f"timed out after {timeout} s\n{tail!r}") from None
    if done.returncode != 0:
        raise ToolError(command, done.returncode, "\n".join(done.stderr.splitlines()[-20:]))
    return done.stdout

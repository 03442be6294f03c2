"""Helpers shared by the integration tests that start the real tritonserver."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "trtllm-pipeline"
# tritonserver's --exit-timeout-secs for the module servers. A clean stop is immediate; the margin
# is for unloading the Python-backend models on a loaded 2-core machine (seen taking over 5 s in
# CI while a benchmark ran beside it). A request or connection truly left open still fails the
# clean-exit check, only later.
SHUTDOWN_TIMEOUT_S = 15


def free_ports(count: int) -> list[int]:
    probes = []
    for _ in range(count):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        probes.append(probe)
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def build_and_package(config: str, root: Path, overrides: tuple[str, ...] = ()) -> dict[str, Path]:
    """Run the pipeline's own CLI on build_configs/<config>.yaml up to the package stage."""
    subprocess.run(
        [str(CLI), "--artifacts", str(root), "run", str(REPO / "build_configs" / f"{config}.yaml"), "--until", "package",
         *(f"--set={override}" for override in overrides)],
        check=True, capture_output=True, timeout=600,
    )
    return packaged(config, root)


def packaged(config: str, root: Path) -> dict[str, Path]:
    """Where the engine, tokenizer and repository of a packaged build under `root` are."""
    [build] = root.glob(f"{config}/build-*")
    [prepare] = root.glob(f"{config}/prepare-*")
    [package] = root.glob(f"{config}/package-*")
    return {"engine": build / "engine", "tokenizer": prepare, "repository": package / "model_repository"}


def assert_stopped_cleanly(returncode: int, log: Path) -> None:
    """Exit 0: no request left in flight and no client connection left open (tritonserver waits its
    exit timeout for either and then exits 1)."""
    if returncode != 0:
        text = log.read_text(errors="replace") if log.is_file() else ""
        waits = [line for line in text.splitlines() if "Timeout " in line and "Found 0 " not in line][-3:]
        raise AssertionError(f"tritonserver exited with {returncode}; see {log}" + "".join(f"\n  {line}" for line in waits))


@contextlib.contextmanager
def running_server(options, workspace: Path):
    """Start the real tritonserver, wait until every model is ready, yield it; then stop it and check that
    it exited cleanly and left no shared-memory regions or python_env directories behind."""
    from pipeline.serve import TritonServer, leaks

    triton = TritonServer(options, workspace=workspace).start()
    try:
        triton.wait_until_ready(timeout=120)
        yield triton
    finally:
        returncode = triton.stop()
    # A clean exit means no request was left in flight (cancelled streams included).
    assert_stopped_cleanly(returncode, workspace / "tritonserver.log")
    assert not list(leaks.SHM_DIR.glob(f"{options.shm_prefix}*")), "shared-memory regions left behind"
    assert not [d for d in triton.python_env_dirs if d.exists()], "python_env dirs left behind"

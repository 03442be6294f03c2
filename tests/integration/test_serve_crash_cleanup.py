"""`stop` after the real tritonserver died with its Python-backend stubs still running (issue 11).

`serve --detach` on the tiny-cpu repository, then the tritonserver pid alone is SIGKILLed, as a crash
leaves it. Its stubs are SIGSTOPped first: a stub of a crashed server can deadlock and stay (that is
what was observed), while a healthy one notices within seconds that its server is gone and exits.
`stop` must end every one of them, name the dead server and remove the shared-memory regions.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from pipeline.serve import leaks, process, read_state
from tests.support.serving import CLI, REPO, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = REPO / "build_configs" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def artifacts(private_tiny_cpu) -> Path:
    return private_tiny_cpu["root"]  # `serve --detach` writes its state into the store


def cli(root: Path, *args: str, ports: list[int]) -> subprocess.CompletedProcess:
    overrides = [f"--set=deploy.{name}_port={port}" for name, port in zip(("http", "grpc", "metrics"), ports)]
    return subprocess.run([str(CLI), "--artifacts", str(root), *args, str(CONFIG), *overrides], capture_output=True, text=True, timeout=120)


def test_stop_after_the_server_was_killed_ends_its_stubs_and_names_the_dead_server(artifacts):
    ports = free_ports(3)
    started = cli(artifacts, "serve", "--detach", ports=ports)
    assert started.returncode == 0, started.stderr
    state_dir = artifacts / "tiny-cpu" / ".serve"
    state = read_state(state_dir)
    try:
        stubs = [p for p in process.group_members(state.pid) if p.is_stub]
        assert len(stubs) >= 2, "the tiny-cpu repository has several Python models"
        for stub in stubs:  # stuck like a deadlocked stub: it cannot exit on its own
            process.kill_if_same(stub.pid, stub.start_ticks, signal.SIGSTOP)
        os.kill(state.pid, signal.SIGKILL)  # the server alone, not its group
        assert process.wait_until(lambda: not state.is_running(), 10)
        assert all(process.is_same_process(s.pid, s.start_ticks) for s in stubs)
        assert list(leaks.SHM_DIR.glob(f"{state.shm_prefix}*")), "a killed server leaves its shm regions"

        stopped = cli(artifacts, "stop", ports=ports)

        assert stopped.returncode == 0, stopped.stderr
        output = stopped.stdout
        assert output.startswith(
            f"the server (pid {state.pid}) that served http://127.0.0.1:{ports[0]} had already exited; see {state_dir / 'tritonserver.last.log'}\n"
        ), output
        pids = ", ".join(str(s.pid) for s in sorted(stubs, key=lambda s: s.pid))
        assert re.search(rf"cleaned up: killed {len(stubs)} Python-backend stubs \(pids {pids}; \d+ MB RSS in total\)", output), output
        assert re.search(r"removed \d+ shared-memory regions?", output), output
        assert not process.group_members(state.pid), "a process of the server's group survived"
        assert not list(leaks.SHM_DIR.glob(f"{state.shm_prefix}*"))
        assert read_state(state_dir) is None and not (state_dir / "workspace").exists()
    finally:  # whatever the test left of its own server
        process.end_server_group(state.pid, state.start_ticks, state.shm_prefix)
        leaks.remove_shm_regions(state.shm_prefix)

"""The wheel, installed (not editable) into a fresh virtual environment, works from a folder outside the checkout,
as a CI build job uses the tool: `validate`, `plan` and `run --until package` of a config that names the default
model by its path, then `serve --detach`, `infer` over gRPC (streamed) and HTTP, and `stop`.

The wheel is built as `make dist` builds it (`python -m build`, here the wheel alone and without an isolated build
environment). The environment is new (`python -m venv`, no system site-packages, no pip of its own: this
environment's pip installs into it) and pip installs the wheel with its dependencies from the package index
configured on this machine, under the project's constraints (torch 2.13.0, the CPU build, from the local wheel).
`--no-compile` leaves the byte-compilation of the dependencies to their first import. The install is the test's
slowest step (2.7 GB unpacked, torch and triton most of it): measured 35 s, and 130 s beside other work; the whole
test 70 s to 3 minutes. Each step's time is printed (`pytest -s`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.load.serving import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "tiny-stdlib-llama"
PROMPT = "def main("
MAX_TOKENS = 12


def test_the_installed_wheel_builds_serves_and_answers_from_outside_the_checkout(tmp_path):
    times: dict[str, float] = {}
    # The new environment's commands see nothing of this one (no PYTHONPATH into the checkout).
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_CONSTRAINT"] = str(REPO / "constraints.txt")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def step(name: str, command: list[str], *, cwd: Path, timeout: float, here: bool = False) -> str:
        """Runs `command` (`here`: in this test's environment), records its time; its stdout."""
        started = time.monotonic()
        done = subprocess.run(command, cwd=cwd, env=None if here else env, capture_output=True, text=True, timeout=timeout)
        times[name] = time.monotonic() - started
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    dist = tmp_path / "dist"
    step("build the wheel", [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)], cwd=REPO, timeout=300, here=True)
    [wheel] = dist.glob("trtllm_pipeline-*.whl")

    venv = tmp_path / "venv"
    step("python -m venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, timeout=120)
    python, cli = venv / "bin" / "python", str(venv / "bin" / "trtllm-pipeline")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # This environment's pip installs into the new one (`--python`): the new one needs no pip of its own
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile", str(wheel)]
    step("pip install the wheel", install, cwd=tmp_path, timeout=900)

    work = tmp_path / "work"  # outside the checkout: nothing of it is on the path
    work.mkdir()
    probe = "import pipeline; from pipeline.sources import model_repo_sources; print(pipeline.__file__); print(model_repo_sources())"
    installed = step("import", [str(python), "-c", probe], cwd=work, timeout=60)
    assert all(Path(line).is_relative_to(venv) for line in installed.split()), installed

    config = yaml.safe_load((REPO / "build_configs" / "tiny-cpu.yaml").read_text())
    config["model"]["source"] = str(DEFAULT_MODEL)  # a config of one's own names its model by path
    http_port, grpc_port, metrics_port = free_ports(3)
    config["deploy"].update(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    (work / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    assert "valid: tiny.yaml" in step("validate", [cli, "validate", "tiny.yaml"], cwd=work, timeout=120)
    assert "package" in step("plan", [cli, "plan", "tiny.yaml"], cwd=work, timeout=120)
    packaged = step("run --until package", [cli, "run", "tiny.yaml", "--until", "package"], cwd=work, timeout=600)
    assert "package" in packaged and (work / "artifacts" / "tiny-cpu").is_dir(), packaged
    step("serve --detach", [cli, "serve", "tiny.yaml", "--detach"], cwd=work, timeout=300)
    try:
        grpc = step(
            "infer (gRPC, streamed)",
            [cli, "infer", PROMPT, "--url", f"127.0.0.1:{grpc_port}", "--stream", "--max-tokens", str(MAX_TOKENS)],
            cwd=work,
            timeout=120,
        )
        http = step(
            "infer (HTTP)",
            [cli, "infer", PROMPT, "--url", f"127.0.0.1:{http_port}", "--protocol", "http", "--max-tokens", str(MAX_TOKENS)],
            cwd=work,
            timeout=120,
        )
    finally:
        stopped = step("stop", [cli, "stop", "tiny.yaml"], cwd=work, timeout=180)
    assert grpc.strip() and grpc.strip() == http.strip(), (grpc, http)  # greedy: the same text over both protocols
    assert "stopped the server" in stopped, stopped
    print("\nwheel install test, seconds per step:\n" + "\n".join(f"  {seconds:6.1f}  {name}" for name, seconds in times.items()))
    print(f"  {sum(times.values()):6.1f}  in all; {PROMPT!r} -> {grpc.strip()!r}")

"""`docker compose up -d` for a deployment directory, through the one seam to external commands."""

from __future__ import annotations

from pathlib import Path

from pipeline.deploy.compose.layout import COMPOSE_FILE
from pipeline.errors import StageError, ToolError
from pipeline.tools import run_command

UP_TIMEOUT_SECONDS = 1800.0  # pulling a Triton TRT-LLM image (tens of GB) and building the cpu image take a while


def compose_command(deploy_dir: Path, profile: str, *args: str) -> list[str]:
    compose_file = deploy_dir / COMPOSE_FILE
    return ["docker", "compose", "--project-directory", str(deploy_dir), "-f", str(compose_file), "--profile", profile, *args]


def compose_up(deploy_dir: Path, profile: str, *, timeout: float = UP_TIMEOUT_SECONDS) -> str:
    """Start the deployment detached; its output. ToolError with a hint when Docker cannot do it."""
    if not (deploy_dir / COMPOSE_FILE).is_file():
        raise StageError(f"{deploy_dir} holds no {COMPOSE_FILE}; run the deploy stage first")
    manual = f"cd {deploy_dir} && docker compose --profile {profile} up -d"
    _require(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        hint=f"--up needs a running Docker engine (none is reachable here); the deployment is written, start it later with: {manual}",
    )
    _require(
        ["docker", "compose", "version"],
        hint=f"--up needs the docker compose plugin (v2); install it, then: {manual}",
    )
    try:
        return run_command(compose_command(deploy_dir, profile, "up", "-d"), timeout=timeout)
    except ToolError as error:
        hint = f"see `docker compose logs` in {deploy_dir}"
        if profile == "gpu":
            hint += "; the gpu profile needs the NVIDIA Container Toolkit and the GPUs listed in deploy.gpus"
        raise ToolError(error.command, error.returncode, error.stderr_tail, hint=hint) from None


def _require(command: list[str], *, hint: str) -> None:
    try:
        run_command(command, timeout=60)
    except ToolError as error:
        raise ToolError(error.command, error.returncode, error.stderr_tail, hint=hint) from None

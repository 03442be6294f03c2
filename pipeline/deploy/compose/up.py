"""`docker compose up -d` for a deployment directory, through the one seam to external commands."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from pipeline.deploy.compose.layout import COMPOSE_FILE
from pipeline.errors import SpecError, StageError, ToolError
from pipeline.tools import run_command

UP_TIMEOUT_SECONDS = 1800.0  # pulling a Triton TRT-LLM image (tens of GB) and building the cpu image take a while


# what `docker compose up` says when an image is neither local nor pullable (registry unreachable, no access)
_MISSING_IMAGE = re.compile(r"pull access denied|manifest unknown|not found|failed to resolve|no such host|i/o timeout|connection refused", re.I)


def compose_command(deploy_dir: Path, profile: str, *args: str, extra_files: Sequence[Path] = ()) -> list[str]:
    files = [arg for path in (deploy_dir / COMPOSE_FILE, *extra_files) for arg in ("-f", str(path))]
    return ["docker", "compose", "--project-directory", str(deploy_dir), *files, "--profile", profile, *args]


def compose_up(
    deploy_dir: Path,
    profile: str,
    *,
    services: Sequence[str] = (),
    extra_files: Sequence[Path] = (),
    timeout: float = UP_TIMEOUT_SECONDS,
) -> str:
    """Start the deployment detached (only `services`, if given; `extra_files` are compose override files
    merged after ours); its output. ToolError with a hint when Docker cannot do it."""
    if not (deploy_dir / COMPOSE_FILE).is_file():
        raise StageError(f"{deploy_dir} holds no {COMPOSE_FILE}; run the deploy stage first")
    _check_request(deploy_dir, services, extra_files)
    files = [f"-f {path}" for path in (COMPOSE_FILE, *extra_files)] if extra_files else []
    manual = " ".join([f"cd {deploy_dir} && docker compose", *files, f"--profile {profile} up -d", *services])
    _require(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        hint=f"--up needs a running Docker engine (none is reachable here); the deployment is written, start it later with: {manual}",
    )
    _require(
        ["docker", "compose", "version"],
        hint=f"--up needs the docker compose plugin (v2); install it, then: {manual}",
    )
    try:
        return run_command(compose_command(deploy_dir, profile, "up", "-d", *services, extra_files=extra_files), timeout=timeout)
    except ToolError as error:
        hint = f"see `docker compose logs` in {deploy_dir}"
        if _MISSING_IMAGE.search(error.stderr_tail or ""):
            hint = (
                "an image is neither on this Docker host nor pullable from its registry: load it first "
                "(`docker save IMAGE -o image.tar` where it is, `docker load -i image.tar` here), or name a reachable one "
                f"with deploy.image; then: {manual}"
            )
        if profile == "gpu":
            hint += "; the gpu profile needs the NVIDIA Container Toolkit and the GPUs listed in deploy.gpus"
        raise ToolError(error.command, error.returncode, error.stderr_tail, hint=hint) from None


def _check_request(deploy_dir: Path, services: Sequence[str], extra_files: Sequence[Path]) -> None:
    """Refuse, before Docker runs, an override file that is not there or a service the deployment has not."""
    for path in extra_files:
        if not path.is_file():
            raise SpecError(f"--file {path}: no such compose file", hint="give the path of a compose override file")
    if services:
        document = yaml.safe_load((deploy_dir / COMPOSE_FILE).read_text(encoding="utf-8")) or {}
        known = sorted(document.get("services") or {})
        unknown = [name for name in services if name not in known]
        if unknown:
            raise SpecError(
                f"--service {', '.join(unknown)}: not a service of this deployment (its services: {', '.join(known)})",
                hint="name services of the rendered docker-compose.yml",
            )


def _require(command: list[str], *, hint: str) -> None:
    try:
        run_command(command, timeout=60)
    except ToolError as error:
        raise ToolError(error.command, error.returncode, error.stderr_tail, hint=hint) from None

"""Pieces every service of the compose deployment is built from: host paths, published ports, mounts, hardening,
the secrets it interpolates from .env."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

TMPFS = "/tmp:rw,nosuid,nodev,size=1g"
LOG_MAX_SIZE = "50m"
LOG_MAX_FILES = "5"


def compose_path(path: Path) -> str:
    """A host path as compose needs it: absolute, or relative starting with `./` or `../`."""
    posix = PurePosixPath(path.as_posix())
    if posix.is_absolute() or posix.parts[:1] == ("..",):
        return str(posix)
    text = str(posix)
    return "." if text == "." else f"./{text}"


def published(address: str, host_port: int, container_port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{host_port}:{container_port}"


def bind_mount(source: Path, target: str) -> dict[str, Any]:
    return {"type": "bind", "source": compose_path(source), "target": target, "read_only": True}


def hardening() -> dict[str, Any]:
    """What every service of the deployment gets."""
    return {
        "read_only": True,
        "tmpfs": [TMPFS],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "restart": "unless-stopped",
        "logging": {"driver": "json-file", "options": {"max-size": LOG_MAX_SIZE, "max-file": LOG_MAX_FILES}},
    }


def required_variable(name: str) -> str:
    """A compose interpolation of a .env variable; a missing entry stops `docker compose` with this text."""
    return "${" + name + ":?set " + name + " in .env}"

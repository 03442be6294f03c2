"""The docker compose deployment directory: the shared layout (pipeline.deploy.layout) plus

    docker-compose.yml        services triton (profile cpu or gpu), openai (cpu), prometheus, grafana
    .env                      COMPOSE_PROJECT_NAME, COMPOSE_PROFILES and the two secrets (mode 0600)

and the compose profile of each build target.
"""

from __future__ import annotations

from pipeline.errors import SpecError

COMPOSE_FILE = "docker-compose.yml"
ENV_FILE = ".env"

_PROFILES = {"engine": "gpu", "cpu": "cpu"}


def profile_for(target: str) -> str:
    """The compose profile of a build target: `gpu` for engine, `cpu` for cpu."""
    profile = _PROFILES.get(str(target))
    if profile is None:
        raise SpecError(
            f"build.target {target!r} has no docker compose deployment yet; deployable targets: {', '.join(_PROFILES)}",
            hint="deploy the engine target (profile gpu) or the cpu target (profile cpu)",
        )
    return profile


def project_name(build_name: str) -> str:
    """A compose project name for a build: lowercase letters, digits, '-' and '_' only."""
    cleaned = "".join(char if char.isalnum() or char in "-_" else "-" for char in build_name.lower())
    return f"trtllm-{cleaned}".strip("-")

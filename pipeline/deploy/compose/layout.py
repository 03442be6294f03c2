"""The docker compose deployment directory: the shared layout (pipeline.deploy.layout) plus

    docker-compose.yml        services triton (profile cpu or gpu), openai (cpu), prometheus, grafana
    .env                      COMPOSE_PROJECT_NAME, COMPOSE_PROFILES and the two secrets (mode 0600)

and the compose profile of each build target.
"""

from __future__ import annotations

from pipeline.deploy.layout import container_facts

COMPOSE_FILE = "docker-compose.yml"
ENV_FILE = ".env"


def profile_for(target: str) -> str:
    """The compose profile of a build target (its backend's: `gpu` for engine, `cpu` for cpu)."""
    return container_facts(target).profile


def project_name(build_name: str) -> str:
    """A compose project name for a build: lowercase letters, digits, '-' and '_' only."""
    cleaned = "".join(char if char.isalnum() or char in "-_" else "-" for char in build_name.lower())
    return f"trtllm-{cleaned}".strip("-")

"""The `openai` service of the compose deployment: the OpenAI-compatible front end before the `triton` service.

An image with the project installed (the cpu profile: Triton's own; the gpu profile: built from the same
Dockerfile on a Python base, since NGC's Triton image lacks the project), running (pipeline.deploy.server_command)
`trtllm-pipeline openai /models --triton-url triton:8001 --host 0.0.0.0 --port 9000 --model-name <name>`:
it reads the served repository (mounted read-only at /models, as Triton's) for the preprocessing
model's facts, and the tokenizer at /tokenizer, where that repository names it. Its API keys come from
TRTLLM_PIPELINE_API_KEYS, interpolated from .env into its environment (never its command line), so every
`/v1/*` request needs `Authorization: Bearer KEY`. Its port is published on `deploy.bind_address`
(loopback by default); it starts once Triton is healthy, and its healthcheck asks `/health` (open without a
key; ready when Triton is). Hardened like every service (non-root, read-only root file system, no capabilities).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.compose.parts import bind_mount, hardening, published, required_variable
from pipeline.deploy.server_command import openai_command

OPENAI_START_PERIOD = "30s"


def openai_service(
    spec: Spec,
    triton: dict[str, Any],
    image: dict[str, Any],
    *,
    model_repository: Path,
    tokenizer_dir: Path | None,
    user: str,
    environment: dict[str, str],
) -> dict[str, Any]:
    """The service, in the profiles of `triton`, from `image` (its build, image and pull_policy keys)."""
    volumes = [bind_mount(model_repository, layout.MODELS_MOUNT)]
    if tokenizer_dir is not None:
        volumes.append(bind_mount(tokenizer_dir, layout.TOKENIZER_MOUNT))
    service: dict[str, Any] = {"profiles": list(triton["profiles"])}
    for key in ("build", "image", "pull_policy"):
        if key in image:
            service[key] = image[key]
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{layout.OPENAI_PORT}/health', timeout=2)"
    service.update(
        {
            "user": user,
            "init": True,
            "command": openai_command(spec),
            "environment": {**environment, layout.OPENAI_API_KEYS_VARIABLE: required_variable(layout.OPENAI_API_KEYS_VARIABLE)},
            "ports": [published(spec.deploy.bind_address, spec.deploy.openai_port, layout.OPENAI_PORT)],
            "volumes": volumes,
            "depends_on": {layout.TRITON_SERVICE: {"condition": "service_healthy"}},
            **hardening(),
            "healthcheck": {
                "test": ["CMD", "python", "-c", probe],
                "interval": "10s",
                "timeout": "5s",
                "retries": 3,
                "start_period": OPENAI_START_PERIOD,
            },
        }
    )
    return service

"""The `trtllm-serve` service of a target in NVIDIA's llmapi layout (pipeline.backends.base.LlmApiRepository): the
OpenAI-compatible server (/v1/completions, /v1/chat/completions, /health, /metrics) of the same build, in its
own compose profile (ComposeFacts.openai_server_profile), so that it and the `triton` service, which hold the
same GPUs, are started one at a time: `docker compose --profile trtllm-serve up -d`.

It runs NVIDIA's TensorRT-LLM release image with the same LLM() options as the Triton model's model.yaml
(`trtllm_serve/extra-llm-api-config.yml`, mounted read-only at /trtllm_serve), the checkpoint at /engine, and
takes the `triton` service's hardening, limits and GPU reservation. Its port is deploy.openai_port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.backends.base import LlmApiRepository
from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.compose.parts import bind_mount, published

_FROM_TRITON = (
    "user",
    "init",
    "environment",
    "shm_size",
    "ulimits",
    "pids_limit",
    "read_only",
    "tmpfs",
    "cap_drop",
    "security_opt",
    "restart",
    "logging",
    "stop_grace_period",
    "deploy",
)


def trtllm_serve_service(
    spec: Spec, triton: dict[str, Any], llm_api: LlmApiRepository, *, profile: str, engine_dir: Path, deploy_dir: Path, options_file: str
) -> dict[str, Any]:
    port = llm_api.openai_port
    service: dict[str, Any] = {"profiles": [profile], "image": llm_api.openai_image(spec)}
    service.update({key: triton[key] for key in _FROM_TRITON if key in triton})
    service.update(
        {
            "command": llm_api.openai_command(layout.ENGINE_MOUNT, f"{layout.OPENAI_FORM_MOUNT}/{options_file}"),
            "ports": [published(spec.deploy.bind_address, spec.deploy.openai_port, port)],
            "volumes": [
                bind_mount(engine_dir, layout.ENGINE_MOUNT),
                bind_mount(deploy_dir / layout.OPENAI_FORM_DIR, layout.OPENAI_FORM_MOUNT),
            ],
            "healthcheck": {
                "test": ["CMD", "curl", "-fsS", "--max-time", "2", f"http://127.0.0.1:{port}/health"],
                **{key: value for key, value in triton["healthcheck"].items() if key != "test"},
            },
        }
    )
    ordered = ("profiles", "image", "user", "init", "command", "environment", "ports", "volumes")
    return {**{key: service[key] for key in ordered if key in service}, **{k: v for k, v in service.items() if k not in ordered}}

"""Render the docker compose file of a deployment: Triton (profile cpu or gpu), Prometheus, Grafana,
and the OpenAI-compatible front end (service `openai`, pipeline.deploy.compose.openai_service).

The document is built as a dict and written by a yaml SafeDumper in insertion order, so the
same spec always gives the same bytes (golden-tested). Every host path in it is relative to the
compose file (`./…`), so the file does not depend on where the artifact store lives; machine-
specific values (secrets, the active profile) come from .env.

Checklist (Triton's secure-deployment guide: triton-inference-server/server docs/customization_guide/deploy.md,
"Secure Deployment Considerations"; NVIDIA's launch flags for the TensorRT-LLM images:
triton-inference-server/tensorrtllm_backend README.md), applied to every service where it fits: pinned
image, non-root user, read-only root file system with a tmpfs /tmp, `cap_drop: [ALL]`,
`no-new-privileges`, ports published on `deploy.bind_address` (loopback by default; Prometheus
and Grafana always on loopback), read-only mounts of the model repository, engine and tokenizer,
`restart: unless-stopped`, a healthcheck, bounded logs. Triton also gets `shm_size`, the stack
ulimit of NVIDIA's launch recipe (and its unlimited memlock where the target pins host memory: not
the cpu target, whose daemon may lack CAP_SYS_RESOURCE to set it), `init` (signals and zombie stubs), a
`stop_grace_period` longer than its `--exit-timeout-secs`, and on the gpu profile a device
reservation for exactly the GPUs of the engine's ranks and an entrypoint that refuses to start
when the container's TensorRT-LLM version or GPU compute capability is not the engine's.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec, Target
from pipeline.deploy import images, layout
from pipeline.deploy.compose.layout import profile_for
from pipeline.deploy.compose.monitoring_services import GRAFANA_VOLUME, PROMETHEUS_VOLUME, grafana_service, prometheus_service
from pipeline.deploy.compose.openai_service import openai_service
from pipeline.deploy.compose.parts import bind_mount, compose_path, hardening, published, required_variable
from pipeline.deploy.compose.trtllm_serve_service import trtllm_serve_service
from pipeline.deploy.server_command import STOP_GRACE_SECS, cpu_server_command, engine_entrypoint, engine_server_command
from pipeline.errors import SpecError

USER = "1000:1000"  # the NGC image's `triton-server`; the cpu image creates the same uid
MEMLOCK_UNLIMITED = {"soft": -1, "hard": -1}
STACK_BYTES = 67108864
PIDS_LIMIT = 8192
HEALTH_URL = f"http://127.0.0.1:{layout.CONTAINER_HTTP_PORT}/v2/health/ready"
ADMIN_KEY = required_variable(layout.ADMIN_KEY_VARIABLE)
RUNTIME_ENVIRONMENT = {  # nothing may reach for the network or write outside /tmp
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HOME": "/tmp/huggingface",
    "XDG_CACHE_HOME": "/tmp/cache",
}


def render_compose(
    spec: Spec,
    *,
    model_repository: Path,
    engine_dir: Path | None,
    target: str,
    tokenizer_dir: Path | None = None,
    deploy_dir: Path = Path("."),
    draft_engine_dir: Path | None = None,
) -> dict[str, Any]:
    """The compose document. Paths are as the compose file sees them (relative to its directory).

    `deploy_dir` holds the Dockerfile (cpu), prometheus/ and grafana/; `engine_dir` and
    `tokenizer_dir` are mounted at /engine and /tokenizer, where the rendered repository looks.
    """
    profile = profile_for(target)
    _check_bind_address(spec.deploy.bind_address)
    facts = layout.container_facts(target)
    triton = _triton_service(spec, target, profile, model_repository, engine_dir, tokenizer_dir, deploy_dir)
    if draft_engine_dir is not None:  # tensorrt_llm_draft's engine (draft-target speculative decoding)
        triton["volumes"].insert(2, bind_mount(draft_engine_dir, layout.DRAFT_ENGINE_MOUNT))
    services = {layout.TRITON_SERVICE: triton}
    llm_api = backend_for(Target(target)).llm_api
    if facts.openai_server_profile is not None and llm_api is not None and engine_dir is not None:
        services[layout.TRTLLM_SERVE_SERVICE] = trtllm_serve_service(
            spec,
            triton,
            llm_api,
            profile=facts.openai_server_profile,
            engine_dir=engine_dir,
            deploy_dir=deploy_dir,
            options_file=llm_api.openai_options_file,
        )
    if llm_api is None:  # the llmapi model speaks another contract: trtllm-serve is its OpenAI endpoint
        # The OpenAI front end runs from the image with the project installed: Triton's own on the cpu profile; on the
        # gpu profile (NGC's image lacks the project) the image built from the same Dockerfile on a Python base.
        image = triton if facts.image_has_project else project_image(spec, deploy_dir)
        services[layout.OPENAI_SERVICE] = openai_service(
            spec, triton, image, model_repository=model_repository, tokenizer_dir=tokenizer_dir, user=USER, environment=RUNTIME_ENVIRONMENT
        )
    return {
        "services": {
            **services,
            layout.PROMETHEUS_SERVICE: prometheus_service(profile, deploy_dir, spec.deploy.prometheus_port),
            layout.GRAFANA_SERVICE: grafana_service(profile, deploy_dir, spec.deploy.grafana_port),
        },
        "volumes": {PROMETHEUS_VOLUME: {}, GRAFANA_VOLUME: {}},
    }


_ADDRESS_LIKE = re.compile(r"^[0-9A-Fa-f.:\[\]]*:[0-9A-Fa-f.:\[\]]*$")


class _PlainDumper(yaml.SafeDumper):
    """safe_dump without anchors and aliases, and with `a:b` numbers (ports, uid:gid) always quoted:
    YAML 1.1 readers turn an unquoted `22:22` into a base-60 integer."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if _ADDRESS_LIKE.match(data):
            return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return super().represent_str(data)


_PlainDumper.add_representer(str, _PlainDumper.represent_str)


def dump_compose(document: dict[str, Any], header: str) -> str:
    """YAML text: the header as comments, then the document in insertion order."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.strip("\n").splitlines())
    body = yaml.dump(document, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)
    return comments + body


def deployment_header(spec: Spec, target: str, *, start: str | None = None) -> str:
    """The compose file's comment block; `start` replaces the line telling how to start it."""
    profile = profile_for(target)
    image = images.server_image(spec, target)
    if start is None:
        start = f"Start from this directory: docker compose --profile {profile} up -d   (.env holds the secrets and the profile)"
    what = f"Base of the cpu image (built from {layout.DOCKERFILE})" if layout.container_facts(target).image_has_project else "Triton image"
    front_end = (
        []
        if backend_for(Target(target)).llm_api is not None
        else [  # the llmapi target's front end is trtllm-serve
            f"The OpenAI front end (service {layout.OPENAI_SERVICE}, :{spec.deploy.openai_port}), the entry to expose, needs "
            f"'Authorization: Bearer KEY' with a key of ${layout.OPENAI_API_KEYS_VARIABLE} (.env) on /v1/*.",
        ]
    )
    return "\n".join(
        [
            f"Rendered by trtllm-pipeline (deploy stage) for build {spec.name!r}, target {target}, profile {profile}. Do not edit:",
            "change the build config and run the pipeline again.",
            start,
            f"{what}: {image.reference}",
            f"  ({image.note})",
            "Prometheus and Grafana are pinned by digest. Ports are published on "
            f"{spec.deploy.bind_address} (Triton) and {layout.MONITORING_BIND_ADDRESS} (Prometheus :{spec.deploy.prometheus_port}, "
            f"Grafana :{spec.deploy.grafana_port}).",
            f"Admin APIs (model repository, config, shared memory, statistics, trace, logging) need the header "
            f"'{layout.ADMIN_KEY_HEADER}: ${layout.ADMIN_KEY_VARIABLE}'.",
            *front_end,
        ]
    )


def _check_bind_address(address: str) -> None:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise SpecError(
            f"deploy.bind_address {address!r} is not an IP address; docker publishes ports on an address, not a host name",
            hint="use 127.0.0.1 (the default, loopback only), ::1, or an address of this host",
        ) from None


def _triton_service(
    spec: Spec,
    target: str,
    profile: str,
    model_repository: Path,
    engine_dir: Path | None,
    tokenizer_dir: Path | None,
    deploy_dir: Path,
) -> dict[str, Any]:
    deploy = spec.deploy
    volumes = [bind_mount(model_repository, layout.MODELS_MOUNT)]
    if engine_dir is not None:
        volumes.append(bind_mount(engine_dir, layout.ENGINE_MOUNT))
    if tokenizer_dir is not None:
        volumes.append(bind_mount(tokenizer_dir, layout.TOKENIZER_MOUNT))
    service: dict[str, Any] = {"profiles": [profile]}
    environment = dict(RUNTIME_ENVIRONMENT)
    facts = layout.container_facts(target)
    if not facts.image_has_project:  # the published Triton TRT-LLM image
        world_size = spec.build.tp_size * spec.build.pp_size if facts.mpi_leader_ranks else 1
        service["image"] = images.server_image(spec, target).reference
        if facts.checks_engine_in_container:
            service["entrypoint"] = engine_entrypoint(images.engine_for_image(spec, service["image"]))
            volumes.append(bind_mount(deploy_dir / layout.ENGINE_CHECK_FILE, layout.ENGINE_CHECK_MOUNT))
        command = engine_server_command(world_size, ADMIN_KEY)
        health = ["CMD", "curl", "-fsS", "--max-time", "2", HEALTH_URL]
        if world_size > 1:
            # OpenMPI's shared-memory single-copy path (CMA) needs CAP_SYS_PTRACE, which cap_drop removes.
            environment["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    else:
        service.update(project_image(spec, deploy_dir))
        command = cpu_server_command(ADMIN_KEY)
        probe = f"import urllib.request; urllib.request.urlopen({HEALTH_URL!r}, timeout=2)"
        health = ["CMD", "python", "-c", probe]
    service.update(
        {
            "user": USER,
            "init": True,
            "command": command,
            "environment": environment,
            "ports": [
                published(deploy.bind_address, deploy.http_port, layout.CONTAINER_HTTP_PORT),
                published(deploy.bind_address, deploy.grpc_port, layout.CONTAINER_GRPC_PORT),
                published(deploy.bind_address, deploy.metrics_port, layout.CONTAINER_METRICS_PORT),
            ],
            "volumes": volumes,
            "shm_size": deploy.shm_size,
            "ulimits": {**({"memlock": dict(MEMLOCK_UNLIMITED)} if facts.locks_memory else {}), "stack": STACK_BYTES},
            "pids_limit": PIDS_LIMIT,
            **hardening(),
            "stop_grace_period": f"{STOP_GRACE_SECS}s",
            "healthcheck": {
                "test": health,
                "interval": "10s",
                "timeout": "5s",
                "retries": 3,
                "start_period": facts.health_start_period,
            },
        }
    )
    if facts.reserves_gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [_gpu_reservation(spec)]}}}
    return service


def project_image(spec: Spec, deploy_dir: Path) -> dict[str, Any]:
    """The image built from the deployment's Dockerfile (the project installed), never looked up in a registry."""
    return {
        "build": {"context": compose_path(deploy_dir), "dockerfile": layout.DOCKERFILE},
        "image": images.cpu_image_tag(spec.name),
        "pull_policy": "build",
    }


def _gpu_reservation(spec: Spec) -> dict[str, Any]:
    ranks = spec.build.tp_size * spec.build.pp_size
    instances = spec.serve.instances.tensorrt_llm
    if ranks > 1 and instances > 1:
        raise SpecError(
            f"serve.instances.tensorrt_llm ({instances}) > 1 with build.tp_size × build.pp_size = {ranks}: "
            "leader mode runs one multi-GPU instance per server (orchestrator mode is not rendered)",
            hint="set serve.instances.tensorrt_llm: 1, or deploy one compose project per instance",
        )
    gpus = spec.deploy.gpus or tuple(range(ranks * instances))
    return {"driver": "nvidia", "device_ids": [str(gpu) for gpu in gpus], "capabilities": ["gpu"]}


# -- the repository's root docker-compose.yml ------------------------------------------------------
ROOT_DEPLOY_DIR = Path("deploy")


def render_root_compose(spec: Spec, *, config_path: str = "build_configs/tiny-cpu.yaml") -> str:
    """The checkout's docker-compose.yml for `spec` (the default config): the stable ./deploy/ layout."""
    target = spec.build.target.value
    profile = profile_for(target)
    document = render_compose(
        spec,
        model_repository=ROOT_DEPLOY_DIR / layout.MODEL_REPOSITORY_DIR,
        engine_dir=ROOT_DEPLOY_DIR / layout.ENGINE_LINK,
        tokenizer_dir=ROOT_DEPLOY_DIR / layout.TOKENIZER_LINK,
        target=target,
        deploy_dir=ROOT_DEPLOY_DIR,
    )
    header = "\n".join(
        [
            f"GENERATED from {config_path} by pipeline.deploy.compose.render_root_compose; do not edit. tests/pipeline/deploy/test_deploy.py",
            "checks that this file equals the rendering (regenerate: UPDATE_GOLDEN=1 pytest tests/pipeline/deploy/test_deploy.py).",
            "",
            f"Every host path below is under ./deploy/, which `trtllm-pipeline deploy {config_path}` fills from the",
            "deploy artifact (artifacts/<build>/deploy-<digest>/deploy/): the model repository rendered for the",
            "container (it names /engine and /tokenizer), links to the engine and tokenizer artifacts, the Dockerfile",
            "and project source of the cpu image, the Prometheus and Grafana provisioning, and .env (the admin key,",
            "the Grafana password, the profile). Artifact directories carry content digests, so this file names only",
            "the stable ./deploy/ layout; the artifact's own docker-compose.yml is the same file with paths relative to it.",
            "",
            deployment_header(
                spec,
                target,
                start="Start from the repository root (needs a Docker engine with the compose plugin):\n"
                f"  docker compose --env-file deploy/.env --profile {profile} up -d",
            ),
        ]
    )
    return dump_compose(document, header)

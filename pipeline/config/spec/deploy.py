"""The spec's deploy section: how the deployment is rendered and started, and where it listens."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from pipeline.config.spec.choices import DeployKind, GPUModel
from pipeline.config.spec.kubernetes import AlertBounds, KubernetesSpec
from pipeline.config.spec.strict import StrictModel

# An image reference: [registry[:port]/]path[:tag][@sha256:<64 hex>], with a tag or a digest (or both).
_IMAGE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?P<tag>:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?P<digest>@sha256:[0-9a-f]{64})?$"
)


class DeploySpec(StrictModel):
    kind: DeployKind = Field(
        default=DeployKind.compose,
        description="How the deployment is rendered and started: compose (docker compose: Triton, Prometheus, Grafana), "
        "kubernetes (manifests with a kustomize base and overlays).",
    )
    image: str | None = Field(
        default=None,
        description="Server container image, NAME:TAG or NAME@sha256:<digest>. Default: the pinned Triton TRT-LLM image of "
        "build.trtllm_version's profile (engine and llmapi targets), or a Python slim base for the cpu image.",
    )
    bind_address: str = Field(default="127.0.0.1", description="Address the published ports bind to (loopback by default).")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton HTTP port.")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton gRPC port.")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton Prometheus metrics port.")
    openai_port: int = Field(default=9000, ge=1, le=65535, description="Host port of the OpenAI-compatible front end (trtllm-serve on the llmapi target).")
    prometheus_port: int = Field(default=9090, ge=1, le=65535, description="Host port of Prometheus (published on 127.0.0.1).")
    grafana_port: int = Field(default=3000, ge=1, le=65535, description="Host port of Grafana (published on 127.0.0.1).")
    gpus: tuple[int, ...] = Field(
        default=(),
        description="Host GPU ids given to the server (engine and llmapi targets); their number must be build.tp_size × "
        "build.pp_size × serve.instances.tensorrt_llm. Empty: the first that many (0, 1, ...); refused with deploy.kind "
        "kubernetes (the scheduler assigns GPUs).",
    )
    gpu: GPUModel | None = Field(
        default=None, description="GPU model the engine is built for and served on; enables the compute-capability checks (e.g. FP8 needs SM >= 8.9)."
    )
    torch_index_url: str = Field(
        default="https://download.pytorch.org/whl/cpu",
        pattern=r"^(https?|file)://\S+$",
        description="Package index the cpu image's Dockerfile installs the CPU build of torch from (a local mirror where the build host has no internet).",
    )
    shm_size: str = Field(default="2g", pattern=r"^[0-9]+[kmgKMG]?$", description="/dev/shm size of the server container (docker notation, e.g. 2g).")
    gpus_per_node: int = Field(
        default=8, ge=1, le=16, description="GPUs of one node: more ranks than this span nodes (deploy.kind kubernetes only: a LeaderWorkerSet)."
    )
    alerts: AlertBounds = Field(default_factory=AlertBounds, description="Bounds of the rendered Prometheus alerts.")
    kubernetes: KubernetesSpec | None = Field(default=None, description="Settings of deploy.kind kubernetes (defaults when absent).")

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        match = _IMAGE.match(value) if value is not None else None
        if value is not None and (match is None or not (match.group("tag") or match.group("digest"))):
            raise ValueError(f"{value!r} is neither NAME:TAG nor NAME@sha256:<64 hex digits> (an image reference with a tag or a digest)")
        return value

    @property
    def kubernetes_settings(self) -> KubernetesSpec:
        return self.kubernetes or KubernetesSpec()

    @model_validator(mode="after")
    def _distinct_ports(self) -> DeploySpec:
        ports = {f"deploy.{name}": getattr(self, name) for name in ("http_port", "grpc_port", "metrics_port", "openai_port", "prometheus_port", "grafana_port")}
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} ({port}) is the same as {seen[port]}; each port must be distinct")
            seen[port] = name
        return self

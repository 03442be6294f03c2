"""The spec's deploy section: how the deployment is rendered and started, and where it listens."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.spec.choices import DeployKind, GPUModel
from pipeline.config.spec.strict import StrictModel


class DeploySpec(StrictModel):
    kind: DeployKind = Field(
        default=DeployKind.compose, description="How the deployment is rendered and started: compose (docker compose: Triton, Prometheus, Grafana)."
    )
    image: str | None = Field(default=None, description="Container image. Default: the pinned Triton TRT-LLM image for engine, a Python slim image for cpu.")
    bind_address: str = Field(default="127.0.0.1", description="Address the published ports bind to (loopback by default).")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton HTTP port.")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton gRPC port.")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton Prometheus metrics port.")
    gpus: tuple[int, ...] = Field(
        default=(), description="GPU device ids given to the server (engine target); their number must be tp_size × pp_size × LLM instances."
    )
    gpu: GPUModel | None = Field(
        default=None, description="GPU model the engine is built for and served on; enables the compute-capability checks (e.g. FP8 needs SM >= 8.9)."
    )
    shm_size: str = Field(default="2g", pattern=r"^[0-9]+[kmgKMG]?$", description="/dev/shm size of the server container (docker notation, e.g. 2g).")

    @model_validator(mode="after")
    def _distinct_ports(self) -> DeploySpec:
        ports = {"deploy.http_port": self.http_port, "deploy.grpc_port": self.grpc_port, "deploy.metrics_port": self.metrics_port}
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} ({port}) is the same as {seen[port]}; each port must be distinct")
            seen[port] = name
        return self

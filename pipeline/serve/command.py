"""A typed boundary to the `tritonserver` command line."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config.spec import DeploySpec
from pipeline.serve.installation import TritonInstallation

SHM_REGION_PREFIX = "triton_python_backend_shm_region_"


def _unique_shm_prefix() -> str:
    # The Python backend appends a UUID; our prefix makes this server's regions identifiable.
    return f"{SHM_REGION_PREFIX}trtllmpipe_{secrets.token_hex(4)}_"


@dataclass(frozen=True)
class ServerOptions:
    """How one tritonserver is started. Ports bind to `bind_address` only (loopback by default)."""

    model_repository: Path
    bind_address: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    exit_timeout_secs: int = 10
    strict_readiness: bool = True
    exit_on_error: bool = True
    log_verbose: int = 0
    shm_prefix: str = field(default_factory=_unique_shm_prefix)

    @classmethod
    def from_deploy(cls, deploy: DeploySpec, model_repository: Path, **overrides) -> ServerOptions:
        return cls(
            model_repository=model_repository,
            bind_address=deploy.bind_address,
            http_port=deploy.http_port,
            grpc_port=deploy.grpc_port,
            metrics_port=deploy.metrics_port,
            **overrides,
        )

    @property
    def client_host(self) -> str:
        """Where a local client connects: loopback when the server listens on every address."""
        if self.bind_address in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.bind_address == "::":
            return "[::1]"
        return f"[{self.bind_address}]" if ":" in self.bind_address else self.bind_address

    @property
    def http_url(self) -> str:
        return f"http://{self.client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.client_host}:{self.metrics_port}/metrics"


def server_command(installation: TritonInstallation, options: ServerOptions, *, model_repository: Path, backend_dir: Path) -> list[str]:
    """The argv of the server; `model_repository` is the directory actually served (a private copy)."""

    def flag(value: bool) -> str:
        return "true" if value else "false"

    return [
        str(installation.binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_dir}",
        f"--cache-directory={installation.caches_dir}",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-address={options.bind_address}",
        f"--http-port={options.http_port}",
        f"--grpc-address={options.bind_address}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-address={options.bind_address}",
        f"--metrics-port={options.metrics_port}",
        "--allow-gpu-metrics=false",
        "--disable-auto-complete-config",
        f"--exit-timeout-secs={options.exit_timeout_secs}",
        f"--exit-on-error={flag(options.exit_on_error)}",
        f"--strict-readiness={flag(options.strict_readiness)}",
        f"--log-verbose={options.log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={options.shm_prefix}",
    ]

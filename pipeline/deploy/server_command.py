"""The commands of the deployed services: `tritonserver` (a typed boundary, like pipeline.serve.command) and
the OpenAI-compatible front end, for every deploy kind.

Hardening (triton-inference-server/server docs/customization_guide/deploy.md, "Secure Deployment
Considerations"): the whole repository is loaded at start-up and never
changed at run time (`--model-control-mode=none`); the admin APIs need the header `admin-key`
whose value the deploy kind passes as `admin_key` (a reference to its secret, e.g. compose's `${…}` from
.env; `--http-restricted-api` / `--grpc-restricted-protocol`, syntax `<api>,<api>,…:<header>=<value>`,
checked against the bundled tritonserver 2.51); SageMaker,
Vertex AI and tracing are off; readiness is strict; shutdown waits `EXIT_TIMEOUT_SECS` for
in-flight requests.

Engine target: the entrypoint first checks that the container runs the engine's TensorRT-LLM version on
a GPU of the engine's compute capability (`engine_entrypoint`), then hands over to NGC's entrypoint.

Engine target with tp×pp > 1: TensorRT-LLM's leader mode, in the form scripts/launch_triton_server.py
generates (triton-inference-server/tensorrtllm_backend; in 1.x NVIDIA/TensorRT-LLM triton_backend/scripts/) — one
`mpirun` with one `-n 1 tritonserver …` block per rank, joined by
`:`. Rank 0 loads and serves the repository; the other ranks load only `tensorrt_llm`
(explicit mode) and never bind a port. Every rank gets its own Python-backend shm prefix.
"""

from __future__ import annotations

from pipeline.backends.engine.runtime import EngineRecord, format_compute_capability
from pipeline.config.spec import Spec
from pipeline.deploy.layout import (
    ADMIN_KEY_HEADER,
    CONTAINER_GRPC_PORT,
    CONTAINER_HTTP_PORT,
    CONTAINER_METRICS_PORT,
    ENGINE_CHECK_MOUNT,
    MODELS_MOUNT,
    OPENAI_PORT,
    TRITON_SERVICE,
)
from pipeline.serve.front_end_route import front_end_triton_model

EXIT_TIMEOUT_SECS = 60
STOP_GRACE_SECS = EXIT_TIMEOUT_SECS + 30  # compose's stop_grace_period: longer than the server's drain
# Every admin API category Triton can restrict; health, metadata and inference stay open.
RESTRICTED_APIS = ("model-repository", "model-config", "shared-memory", "statistics", "trace", "logging")
# Bounded gRPC response pool (the default is INT_MAX; B1.6). Triton ≥ 25.x only: the bundled
# tritonserver 2.51 of the cpu image does not know the flag.
GRPC_MAX_RESPONSE_POOL_SIZE = 1024
LLM_MODEL = "tensorrt_llm"
NGC_TRITONSERVER = "tritonserver"  # on PATH in the Triton TRT-LLM image (/opt/tritonserver/bin)
NGC_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"  # the NGC images' own ENTRYPOINT

# The cpu image (pipeline.deploy.dockerfile): the wheel's server linked at a fixed path, and the
# private backend directory of symlinks that `trtllm-pipeline serve` also uses (pipeline/serve/installation.py).
CPU_TRITONSERVER_ROOT = "/opt/tritonserver"
CPU_BACKEND_DIR = "/opt/triton-backends"


def restricted_api_value(admin_key: str) -> str:
    return ",".join(RESTRICTED_APIS) + f":{ADMIN_KEY_HEADER}={admin_key}"


def _hardening_flags(admin_key: str) -> list[str]:
    restricted = restricted_api_value(admin_key)
    return [
        f"--http-port={CONTAINER_HTTP_PORT}",
        f"--grpc-port={CONTAINER_GRPC_PORT}",
        f"--metrics-port={CONTAINER_METRICS_PORT}",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
        "--allow-sagemaker=false",
        "--allow-vertex-ai=false",
        "--trace-config=level=off",
        f"--exit-timeout-secs={EXIT_TIMEOUT_SECS}",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
    ]


def cpu_server_command(admin_key: str) -> list[str]:
    """The cpu image's server: the nvidia-pytriton tritonserver, Python backend only, no GPU metrics."""
    return [
        f"{CPU_TRITONSERVER_ROOT}/bin/tritonserver",
        f"--model-repository={MODELS_MOUNT}",
        "--model-control-mode=none",
        f"--backend-directory={CPU_BACKEND_DIR}",
        f"--cache-directory={CPU_TRITONSERVER_ROOT}/caches",
        "--allow-gpu-metrics=false",
        *_hardening_flags(admin_key),
    ]


def engine_server_command(world_size: int, admin_key: str) -> list[str]:
    """The Triton TRT-LLM image's server; under `mpirun` in leader mode when the engine has several ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    rank0 = [NGC_TRITONSERVER, f"--model-repository={MODELS_MOUNT}", "--model-control-mode=none", *_engine_flags(admin_key)]
    if world_size == 1:
        return rank0
    command = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            command.append(":")
            block = [
                NGC_TRITONSERVER,
                f"--model-repository={MODELS_MOUNT}",
                "--model-control-mode=explicit",
                f"--load-model={LLM_MODEL}",
                *_engine_flags(admin_key),
            ]
        else:
            block = list(rank0)
        command += ["-n", "1", *block, f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
    return command


def _engine_flags(admin_key: str) -> list[str]:
    return [*_hardening_flags(admin_key), f"--grpc-max-response-pool-size={GRPC_MAX_RESPONSE_POOL_SIZE}"]


def engine_entrypoint(engine: EngineRecord) -> list[str]:
    """The engine target's entrypoint: check the container's TensorRT-LLM version and GPU compute capability
    against the engine's (pipeline/backends/engine/runtime.py, mounted read-only), then exec NGC's entrypoint
    with the service's command. A mismatch stops the container with both values in its log."""
    check = ["python3", ENGINE_CHECK_MOUNT, f"--trtllm-version={engine.trtllm_version}"]
    if engine.compute_capability is not None:
        check.append(f"--compute-capability={format_compute_capability(engine.compute_capability)}")
    if engine.gpu is not None:
        check.append(f"--gpu={engine.gpu}")
    return [*check, "--", NGC_ENTRYPOINT]


def world_size_of(command: list[str]) -> int:
    """MPI ranks a rendered command starts: the sum of its `-n` counts, or 1 without mpirun."""
    if not command or command[0] != "mpirun":
        return 1
    return sum(int(command[i + 1]) for i, token in enumerate(command[:-1]) if token == "-n")


def openai_command(spec: Spec, triton_url: str = f"{TRITON_SERVICE}:{CONTAINER_GRPC_PORT}", api_key_file: str | None = None) -> list[str]:
    """The OpenAI-compatible front end, next to Triton (gRPC at `triton_url`): it reads the served repository at /models,
    and its API keys from `api_key_file` if given (else from its environment's TRTLLM_PIPELINE_API_KEYS). It calls the
    front end's default route (pipeline.serve.front_end_route: the ensemble), named."""
    keys = ["--api-key-file", api_key_file] if api_key_file else []
    return [
        "trtllm-pipeline",
        "openai",
        MODELS_MOUNT,
        "--triton-url",
        triton_url,
        "--host",
        "0.0.0.0",
        "--port",
        str(OPENAI_PORT),
        "--model-name",
        spec.name,
        "--triton-model",
        front_end_triton_model(spec.serve.model_name),
        *keys,
    ]

"""Which Triton model the OpenAI front end calls when `--triton-model` does not say: the BLS
(`tensorrt_llm_bls`) on a Triton older than 2.57, the ensemble (`serve.model_name`) otherwise.

Why the BLS there: on the tritonserver 2.51 that nvidia-pytriton bundles (`serve`, the cpu image), 64
concurrent streams with half of them cut through the ensemble corrupted the server's own heap within
minutes, whether they came over gRPC, HTTP or the front end, while the front end on the BLS took the
same traffic and stopped clean (BENCHMARKS.md, "Soak"). The abort is in the ensemble scheduler's
allocation of a response of the Python-backend `tensorrt_llm`. 2.57 is the first release with both
upstream fixes of the races between a gRPC stream's cancellation and its response completion
(server #7840 in 2.54, #8078 in 2.57). The engine target's images (NGC 25.09 and newer) are past it,
and their `tensorrt_llm` is the C++ backend, so they keep NVIDIA's route, the ensemble; the soak has
not been run on them. A version that is not known (Triton not reachable) keeps the ensemble too.
Its cost on 2.51: after the front end's test traffic Triton may keep `tensorrt_llm_bls` loaded at stop (exit 1
after the exit timeout; tests/support/serving.py STUCK_BLS), as it sometimes keeps the ensemble.
"""

from __future__ import annotations

import re

BLS_MODEL = "tensorrt_llm_bls"
ENSEMBLE_SAFE_FROM = (2, 57)


def front_end_triton_model(triton_version: str | None, ensemble: str) -> str:
    """The Triton model the front end calls by default on a Triton of `triton_version` (e.g. "2.51.0")."""
    release = _major_minor(triton_version)
    return BLS_MODEL if release is not None and release < ENSEMBLE_SAFE_FROM else ensemble


def triton_version(grpc_url: str, timeout_s: float = 5.0) -> str | None:
    """The server version Triton at `grpc_url` reports (server metadata, open in hardened deployments), or None."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(grpc_url)
    except InferenceServerException:
        return None
    try:
        return client.get_server_metadata(client_timeout=timeout_s).version or None
    except InferenceServerException:
        return None
    finally:
        client.close()


def _major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None

"""The container images of a deployment, pinned.

- Triton with TensorRT-LLM (gpu profile): the tag of the TensorRT-LLM version profile
  (`pipeline.trtllm_versions`). No digest is recorded for these images, so they are pinned
  by tag only; `deploy.image` may name `<image>@sha256:<digest>` instead (a tag is mutable,
  a digest is not).
- Prometheus, Grafana and the Python base of the cpu image: tag and digest. The digests are the
  registry's content addresses of those tags as several independent public deployments pin them;
  `docker buildx imagetools inspect <image>` shows them. A wrong digest fails the pull, never
  silently runs something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.backends.engine.runtime import EngineRecord, mismatches
from pipeline.backends.engine.target import declared_engine, image_runtime
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec, Target
from pipeline.errors import SpecError

PROMETHEUS_IMAGE = "prom/prometheus:v3.5.0@sha256:63805ebb8d2b3920190daf1cb14a60871b16fd38bed42b857a3182bc621f4996"
GRAFANA_IMAGE = "grafana/grafana:12.1.1@sha256:a1701c2180249361737a99a01bc770db39381640e4d631825d38ff4535efa47d"
# The Python minor version must have a Python-backend stub in nvidia-pytriton (3.8–3.13); glibc ≥ 2.35.
PYTHON_BASE_IMAGE = "python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1"
CPU_IMAGE_NAME = "trtllm-pipeline-cpu"  # the locally built image of the cpu profile: <name>:<build>


@dataclass(frozen=True)
class ServerImage:
    """The image the Triton service runs (engine) or is built from (cpu), and how it is pinned."""

    reference: str
    pinned_by_digest: bool
    note: str


def is_digest_pinned(reference: str) -> bool:
    return "@sha256:" in reference


def server_image(spec: Spec, target: str) -> ServerImage:
    """The Triton image (engine target) or the base image of the cpu image (cpu target)."""
    if spec.deploy.image is not None:
        reference = spec.deploy.image
        note = "deploy.image"
    elif (published := backend_for(Target(target)).server_image(spec)) is not None:
        reference, note = published
    else:
        reference = PYTHON_BASE_IMAGE
        note = "Python base of the cpu image"
    pinned = is_digest_pinned(reference)
    if not pinned:
        note += "; pinned by tag only, no digest recorded: pin it with deploy.image: <image>@sha256:<digest>"
    return ServerImage(reference, pinned, note)


def cpu_image_tag(build_name: str) -> str:
    return f"{CPU_IMAGE_NAME}:{build_name.lower()}"


def engine_for_image(spec: Spec, image: str) -> EngineRecord:
    """The engine the spec builds, refused when deploy.image is a Triton TRT-LLM image of another version."""
    engine = declared_engine(spec)
    problems = mismatches(engine, image_runtime(image))
    if problems:
        raise SpecError(
            f"deploy.image cannot serve this engine: {'; '.join(problems)}",
            hint="use the image of build.trtllm_version's profile (leave deploy.image unset), or set build.trtllm_version to the image's version",
        )
    return engine

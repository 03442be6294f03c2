"""Where a job that needs NVIDIA's TensorRT-LLM stack runs: on this host (`local`), in the version profile's
pinned `tritonserver:<tag>-trtllm-python-py3` image (`docker`), or nowhere (`dry-run`).

A job describes itself as a `ContainerJob` (its argv inside the image, what it mounts, its working directory
and environment); a `JobRunner` only runs it. What a job reads before it runs, what it must have written
after, and what its dry run writes stay with the job (pipeline.backends.engine.build_job for trtllm-build,
pipeline.quantization.dispatch for the quantize job). Every external command goes through
`pipeline.tools.run_command`.

Every `docker run` gets one set of flags (`docker_run_command`): the GPUs, shm and memlock/stack ulimits of
NVIDIA's launch recipe, the calling user with HOME=/tmp, and no network. No job needs one: trtllm-build reads
only --checkpoint_dir, --build_config and --lora_dir and writes --output_dir (tensorrt_llm/commands/build.py), and the
quantize job reads the mounted Hugging Face checkpoint and calibration files with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pipeline import tools
from pipeline.errors import SpecError, StageError, ToolError

RUNNER_KINDS = ("local", "docker", "dry-run")
DOCKER_ENGINE_TIMEOUT_S = 30.0
ULIMITS = ("memlock=-1", "stack=67108864")  # NVIDIA's launch recipe for the TensorRT-LLM images
CONTAINER_HOME = "/tmp"  # the calling user has no home directory in the image

RunCommand = Callable[..., str]
Which = Callable[[str], "str | None"]


class RunnerUnavailable(StageError):
    """The chosen build runner cannot run on this machine (tool missing, Docker engine unreachable, no weights)."""

    default_hint = "run on a GPU build host, or use `--runner dry-run` to render the engine directory without building"


@dataclass(frozen=True)
class Mount:
    host: Path
    container: Path
    read_only: bool = True

    @property
    def volume(self) -> str:
        """`docker run -v` notation."""
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ContainerJob:
    """One command for NVIDIA's image, and what it sees there."""

    argv: tuple[str, ...]  # inside the image; on this host for the local runner
    image: str  # the version profile's pinned image (a docker runner's `image` replaces it)
    work_dir: Path  # `-w` in the container, the working directory on this host
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # What the local runner checks before anything is written: raises RunnerUnavailable naming what this host lacks.
    check_host: Callable[[Which], None] | None = None
    # The local runner calls this instead of spawning argv (this project's own Python job: in this process its log
    # goes to the stage's log and its errors keep their type).
    run_here: Callable[[], object] | None = None


class JobRunner(Protocol):
    kind: str  # one of RUNNER_KINDS
    dry_run: bool  # True: `run` runs nothing; the job writes its own dry run instead

    def check(self, job: ContainerJob) -> None:
        """Raise RunnerUnavailable when `job` cannot run here (before the job writes anything)."""
        ...

    def command(self, job: ContainerJob) -> tuple[str, ...]:
        """What `run` runs: the job's argv (local, dry-run) or the whole `docker run` (docker)."""
        ...

    def docker_command(self, job: ContainerJob) -> tuple[str, ...] | None:
        """The `docker run` that `--runner docker` runs for this job (None for the local runner)."""
        ...

    def run(self, job: ContainerJob) -> str:
        """Run the job; its output."""
        ...


def make_runner(kind: str, *, image: str | None = None, gpus: Sequence[int] = (), shm_size: str = "2g") -> JobRunner:
    docker = DockerRunner(image=image, gpus=tuple(gpus), shm_size=shm_size)
    if kind == "local":
        return LocalRunner()
    if kind == "docker":
        return docker
    if kind == "dry-run":
        return DryRunRunner(docker=docker)
    raise SpecError(f"build runner {kind!r} is not one of {', '.join(RUNNER_KINDS)}")


def docker_run_command(job: ContainerJob, *, image: str | None, gpus: Sequence[int], shm_size: str, uid: int, gid: int) -> list[str]:
    """`docker run` of `job` in NVIDIA's TensorRT-LLM image: the one flag set every job gets, then the job's own."""
    devices = f'"device={",".join(str(g) for g in gpus)}"' if gpus else "all"
    return [
        "docker",
        "run",
        "--rm",
        "--gpus",
        devices,
        "--shm-size",
        shm_size,
        *(arg for limit in ULIMITS for arg in ("--ulimit", limit)),
        "-u",
        f"{uid}:{gid}",
        "-e",
        f"HOME={CONTAINER_HOME}",
        *(arg for name, value in job.env for arg in ("-e", f"{name}={value}")),
        "--network",
        "none",
        *(arg for mount in job.mounts for arg in ("-v", mount.volume)),
        "-w",
        str(job.work_dir),
        image or job.image,
        *job.argv,
    ]


def check_docker_engine(which: Which, run_command: RunCommand) -> str:
    """The Docker engine's version, or RunnerUnavailable when the client or the engine is missing."""
    if which("docker") is None:
        raise RunnerUnavailable("docker is not installed (no `docker` on PATH); the docker runner needs Docker with the NVIDIA container toolkit")
    probe = ["docker", "info", "--format", "{{.ServerVersion}}"]
    try:
        version = run_command(probe, timeout=DOCKER_ENGINE_TIMEOUT_S).strip()
    except ToolError as exc:
        reason = exc.stderr_tail.strip().splitlines()[-1] if exc.stderr_tail.strip() else f"exit code {exc.returncode}"
        raise RunnerUnavailable(
            f"the Docker engine is not reachable ({reason})",
            hint="start the Docker daemon (or set DOCKER_HOST), or use --runner local on a GPU host, or --runner dry-run",
        ) from None
    if not version:
        raise RunnerUnavailable("the Docker engine did not report a server version (`docker info`); is the daemon running?")
    return version


# -- runners --------------------------------------------------------------------------------------
@dataclass
class LocalRunner:
    """The job on this host (a GPU host with TensorRT-LLM installed)."""

    run_command: RunCommand = tools.run_command
    which: Which = shutil.which
    timeout: float | None = None
    kind: str = field(default="local", init=False)
    dry_run: bool = field(default=False, init=False)

    def check(self, job: ContainerJob) -> None:
        if job.check_host is not None:
            job.check_host(self.which)

    def command(self, job: ContainerJob) -> tuple[str, ...]:
        return job.argv

    def docker_command(self, job: ContainerJob) -> tuple[str, ...] | None:
        return None

    def run(self, job: ContainerJob) -> str:
        if job.run_here is not None:
            job.run_here()
            return ""
        return self.run_command(list(job.argv), cwd=job.work_dir, timeout=self.timeout)


@dataclass
class DockerRunner:
    """The job inside the pinned `tritonserver:<tag>-trtllm-python-py3` image, as the calling user."""

    image: str | None = None  # default: the job's (the version profile's) image
    gpus: tuple[int, ...] = ()  # () = all GPUs
    shm_size: str = "2g"
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    run_command: RunCommand = tools.run_command
    which: Which = shutil.which
    timeout: float | None = None
    kind: str = field(default="docker", init=False)
    dry_run: bool = field(default=False, init=False)

    def check_engine(self) -> str:
        return check_docker_engine(self.which, self.run_command)

    def check(self, job: ContainerJob) -> None:
        self.check_engine()

    def command(self, job: ContainerJob) -> tuple[str, ...]:
        return tuple(docker_run_command(job, image=self.image, gpus=self.gpus, shm_size=self.shm_size, uid=self.uid, gid=self.gid))

    def docker_command(self, job: ContainerJob) -> tuple[str, ...] | None:
        return self.command(job)

    def run(self, job: ContainerJob) -> str:
        return self.run_command(list(self.command(job)), timeout=self.timeout)


@dataclass
class DryRunRunner:
    """Runs nothing: the job writes what it would read and run, for a GPU host (and names the docker runner's command)."""

    docker: DockerRunner = field(default_factory=DockerRunner)
    kind: str = field(default="dry-run", init=False)
    dry_run: bool = field(default=True, init=False)

    def check(self, job: ContainerJob) -> None:
        return None

    def command(self, job: ContainerJob) -> tuple[str, ...]:
        return job.argv

    def docker_command(self, job: ContainerJob) -> tuple[str, ...] | None:
        return self.docker.command(job)

    def run(self, job: ContainerJob) -> str:
        return ""

"""Where the quantize job runs for the engine target with `quantize.device: cuda`: through the build runner.

* `local`: in this process, on this host's GPU (refused when torch sees no CUDA device);
* `docker`: `python3 -m pipeline.backends.quantize_job` in the version profile's pinned Triton TRT-LLM
  image, with this project's `pipeline/` package mounted read-only on PYTHONPATH, the prepared HF
  checkpoint and the calibration files mounted read-only, the artifact directory read-write, the GPUs,
  shm and ulimits of the build runner's `docker run`, as the calling user, without network;
* `dry-run`: nothing runs; `quantize.sh` and the request are written for a GPU host.

Every runner writes `quantize_request.json` and `quantize.sh` into the artifact first. The real ones then
check the checkpoint the job wrote (config.json quantization and mapping, one rank file per rank), as the
build runners check an engine directory. Otherwise (quantize.device cpu, or another target) the quantize
stage calls `quantize_job.run_job` in its own process and writes neither file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pipeline
from pipeline import tools
from pipeline.backends.quantize_job import (
    JOB_MODULE,
    REQUEST_FILE,
    RESULT_FILE,
    CalibrationRequest,
    QuantizeRequest,
)
from pipeline.backends.runners import (
    RunCommand,
    RunnerUnavailable,
    Which,
    check_docker_engine,
    docker_run_prefix,
)
from pipeline.backends.trtllm_build import TRTLLM_KV_QUANT_ALGO, TRTLLM_QUANT_ALGO
from pipeline.backends.trtllm_versions import TrtllmVersion, get_version
from pipeline.config.format_rules import needs_calibration
from pipeline.config.spec import BuildRunnerKind, QuantDevice, Spec
from pipeline.config.targets import traits_of
from pipeline.errors import SpecError, StageError

SCRIPT_FILE = "quantize.sh"
CHECKPOINT_DIR = "trtllm_checkpoint"
UNIFIED_HF_DIR = "hf_checkpoint"  # for the llmapi target (TensorRT-LLM's PyTorch backend)
CONTAINER_SOURCE = "/opt/trtllm-pipeline"  # PYTHONPATH in the container; the `pipeline` package is mounted below it
IN_PROCESS = "in-process"


def quantize_route(spec: Spec) -> str:
    """`in-process` (this process, on quantize.device), or the build runner kind that runs the quantize job.

    A dry run never calibrates; the engine target on cuda goes through build.runner; everything else
    (quantize.device cpu, the cpu and llmapi targets) runs in this process.
    """
    if spec.dry_run:
        return BuildRunnerKind.dry_run.value
    if traits_of(spec.build.target).builds_through_runner and spec.quantize.device is QuantDevice.cuda:
        return spec.build.runner.value
    return IN_PROCESS


def request_from_spec(spec: Spec, hf_dir: Path, artifact_dir: Path, *, result_file: bool) -> QuantizeRequest:
    """The job's request, with every path absolute under `artifact_dir` (the directory the job will see)."""
    from pipeline.calibration import calibration_files

    quantize = spec.quantize
    calibration = None
    if needs_calibration(quantize):
        c = quantize.calibration
        files = tuple(f.resolve() for f in calibration_files(c))
        calibration = CalibrationRequest(files, c.num_samples, c.max_seq_len, c.batch_size, c.seed)
    artifact_dir = Path(artifact_dir).resolve()
    return QuantizeRequest(
        hf_dir=Path(hf_dir).resolve(),
        output_dir=artifact_dir / CHECKPOINT_DIR,
        dtype=spec.model.dtype.value,
        tp_size=spec.build.tp_size,
        pp_size=spec.build.pp_size,
        algo=quantize.algo.value,
        kv_cache=quantize.kv_cache.value,
        group_size=quantize.group_size,
        device=quantize.device.value,
        calibration=calibration,
        unified_hf_dir=artifact_dir / UNIFIED_HF_DIR if traits_of(spec.build.target).exports_unified_hf else None,
        result_file=artifact_dir / RESULT_FILE if result_file else None,
    )


@dataclass(frozen=True)
class QuantizeJob:
    """A request, where the job will read it (`artifact_dir`), and where its files are written now (`work_dir`).

    They differ for a dry run: the files name the final artifact directory, to be run later on a GPU host.
    """

    name: str
    request: QuantizeRequest
    artifact_dir: Path
    work_dir: Path
    version: TrtllmVersion

    @property
    def request_path(self) -> Path:
        return self.artifact_dir / REQUEST_FILE

    @property
    def argv(self) -> tuple[str, ...]:
        return ("python3", "-m", JOB_MODULE, "--request", str(self.request_path))


@dataclass(frozen=True)
class QuantizeOutcome:
    dry_run: bool
    command: tuple[str, ...]  # what ran, or would run
    result: dict[str, Any] | None  # the job's result (None for a dry run)
    log: str = ""
    docker_command: tuple[str, ...] | None = None  # the `docker run` of the docker runner (docker, and dry run on cuda)


class QuantizeRunner(Protocol):
    def run(self, job: QuantizeJob) -> QuantizeOutcome:
        ...


def make_quantize_runner(kind: str, *, image: str | None = None, gpus: Sequence[int] = (), shm_size: str = "2g", log=None) -> QuantizeRunner:
    docker = DockerQuantizeRunner(image=image, gpus=tuple(gpus), shm_size=shm_size)
    if kind == "local":
        return LocalQuantizeRunner(log=log)
    if kind == "docker":
        return docker
    if kind == "dry-run":
        return DryRunQuantizeRunner(docker=docker)
    raise SpecError(f"quantize runner {kind!r} is not one of local, docker, dry-run")


def job_for(spec: Spec, request: QuantizeRequest, artifact_dir: Path, work_dir: Path) -> QuantizeJob:
    return QuantizeJob(spec.name, request, Path(artifact_dir), Path(work_dir), get_version(spec.build.trtllm_version))


# -- shared steps ---------------------------------------------------------------------------------------
def write_job_inputs(job: QuantizeJob, docker_command: Sequence[str] | None = None) -> None:
    """`quantize_request.json` and `quantize.sh` (the exact command) in the artifact directory."""
    job.work_dir.mkdir(parents=True, exist_ok=True)
    job.request.write(job.work_dir / REQUEST_FILE)
    script = job.work_dir / SCRIPT_FILE
    script.write_text(render_script(job, docker_command), encoding="utf-8")
    script.chmod(0o755)


def render_script(job: QuantizeJob, docker_command: Sequence[str] | None = None) -> str:
    r, v = job.request, job.version
    lines = [
        "#!/usr/bin/env bash",
        (f"# quantize job for {job.name}: {r.algo} weights, {r.kv_cache} KV cache, calibrated on {r.device}; "
         f"TensorRT-LLM checkpoint (tp={r.tp_size}, pp={r.pp_size}) for TensorRT-LLM {v.version}"),
        f"# request: {job.request_path}",
        "# rendered by trtllm-pipeline. Needs this project's pipeline/ package importable, with torch (CUDA),",
        "# transformers and nvidia-modelopt < 0.49, as in NVIDIA's image:",
        f"#   {v.image}",
    ]
    if docker_command is not None:
        lines += ["# In that image, as `--runner docker` runs it:", f"#   {shlex.join(docker_command)}"]
    lines += ["set -euo pipefail", shlex.join(job.argv)]
    return "\n".join(lines) + "\n"


def check_checkpoint_output(request: QuantizeRequest) -> dict[str, Any]:
    """After a real job: config.json with the requested quantization and mapping, and one rank file per rank."""
    path = request.output_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"the quantize job finished but {path} is missing or unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise StageError(f"the quantize job finished but {path} is not a JSON object")
    quant, mapping = config.get("quantization") or {}, config.get("mapping") or {}
    found = {
        "quantization.quant_algo": (quant.get("quant_algo"), TRTLLM_QUANT_ALGO[request.algo]),
        "quantization.kv_cache_quant_algo": (quant.get("kv_cache_quant_algo"), TRTLLM_KV_QUANT_ALGO[request.kv_cache]),
        "mapping.tp_size": (mapping.get("tp_size"), request.tp_size),
        "mapping.pp_size": (mapping.get("pp_size"), request.pp_size),
    }
    wrong = [f"{key} is {got!r}, the request asks for {want!r}" for key, (got, want) in found.items() if got != want]
    if wrong:
        raise StageError(f"the quantize job wrote {path} that does not match its request: " + "; ".join(wrong))
    world = request.tp_size * request.pp_size
    missing = [f"rank{r}.safetensors" for r in range(world) if not (request.output_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise StageError(f"the quantize job finished but {request.output_dir} lacks {', '.join(missing)} (world size {world})")
    return config


def read_result(request: QuantizeRequest) -> dict[str, Any]:
    try:
        result = json.loads(Path(request.result_file).read_text(encoding="utf-8"))
    except (OSError, TypeError, ValueError) as exc:
        raise StageError(f"the quantize job finished but its result {request.result_file} is missing or unreadable ({exc})") from None
    if not isinstance(result, dict) or not isinstance(result.get("quantization"), dict):
        raise StageError(f"{request.result_file}: not a quantize job result")
    return result


def package_dir() -> Path:
    """This project's `pipeline` package directory (mounted read-only into the container)."""
    return Path(pipeline.__file__).resolve().parent


# -- runners --------------------------------------------------------------------------------------------
@dataclass
class LocalQuantizeRunner:
    """The job in this process, on this host's GPU (build.runner local)."""

    log: Any = None
    cuda_available: Any = None  # () -> bool; default torch.cuda.is_available

    def run(self, job: QuantizeJob) -> QuantizeOutcome:
        from pipeline.backends.quantize_job import run_job

        available = self.cuda_available or _torch_cuda_available
        if job.request.device == "cuda" and not available():
            raise RunnerUnavailable(
                "quantize.device is cuda with build.runner local, but torch sees no CUDA device on this host",
                hint="run on a GPU host, use --runner docker (the GPU is in the container) or --runner dry-run, or set quantize.device: cpu",
            )
        write_job_inputs(job)
        result = run_job(job.request, log=self.log)
        check_checkpoint_output(job.request)
        return QuantizeOutcome(False, job.argv, result)


def _torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@dataclass
class DockerQuantizeRunner:
    """The job in the pinned `tritonserver:<tag>-trtllm-python-py3` image (which ships torch, transformers, ModelOpt)."""

    image: str | None = None  # default: the version's pinned image
    gpus: tuple[int, ...] = ()  # () = all GPUs
    shm_size: str = "2g"
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    source_dir: Path = field(default_factory=package_dir)
    run_command: RunCommand = tools.run_command
    which: Which = shutil.which
    timeout: float | None = None

    def mounts(self, job: QuantizeJob) -> list[tuple[str, str, str]]:
        """(host path, container path, mode): our package, the HF checkpoint, the calibration files, the artifact."""
        r = job.request
        mounts = [(str(self.source_dir), f"{CONTAINER_SOURCE}/pipeline", "ro"), (str(r.hf_dir), str(r.hf_dir), "ro")]
        for path in r.calibration.files if r.calibration is not None else ():
            if not any(str(path) == m[0] or str(path).startswith(m[0] + "/") for m in mounts[1:]):
                mounts.append((str(path), str(path), "ro"))
        mounts.append((str(job.artifact_dir), str(job.artifact_dir), "rw"))
        return mounts

    def command(self, job: QuantizeJob) -> list[str]:
        volumes = [arg for host, inside, mode in self.mounts(job) for arg in ("-v", f"{host}:{inside}" + (":ro" if mode == "ro" else ""))]
        return [
            *docker_run_prefix(self.gpus, self.shm_size, self.uid, self.gid),
            "-e", f"PYTHONPATH={CONTAINER_SOURCE}", "-e", "PYTHONDONTWRITEBYTECODE=1", "-e", "HF_HUB_OFFLINE=1",
            "--network", "none",
            *volumes, "-w", str(job.artifact_dir),
            self.image or job.version.image, *job.argv,
        ]

    def check_engine(self) -> str:
        return check_docker_engine(self.which, self.run_command)

    def run(self, job: QuantizeJob) -> QuantizeOutcome:
        self.check_engine()
        command = self.command(job)
        write_job_inputs(job, command)
        log = self.run_command(command, timeout=self.timeout)
        check_checkpoint_output(job.request)
        return QuantizeOutcome(False, tuple(command), read_result(job.request), log, tuple(command))


@dataclass
class DryRunQuantizeRunner:
    """Writes the request and `quantize.sh` (with the `docker run` the docker runner would use), runs nothing."""

    docker: DockerQuantizeRunner = field(default_factory=DockerQuantizeRunner)

    def run(self, job: QuantizeJob) -> QuantizeOutcome:
        docker_command = self.docker.command(job) if job.request.device == "cuda" else None
        write_job_inputs(job, docker_command)
        return QuantizeOutcome(True, job.argv, None, docker_command=None if docker_command is None else tuple(docker_command))

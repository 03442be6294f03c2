"""Where the quantize job runs: in this process, or, for the engine target with `quantize.device: cuda`,
through the build runner (pipeline.container_jobs) as a container job:

* `local`: in this process, on this host's GPU (refused when torch sees no CUDA device);
* `docker`: `python3 -m pipeline.quantization.job` in the version profile's pinned Triton TRT-LLM
  image, with this project's `pipeline/` package mounted read-only on PYTHONPATH, the prepared HF
  checkpoint and the calibration files mounted read-only, the artifact directory read-write (and the
  runner's GPUs, shm, ulimits, user and no network);
* `dry-run`: nothing runs; `quantize.sh` and the request are written for a GPU host.

Every runner writes `quantize_request.json` and `quantize.sh` into the artifact first. After a real job
the checkpoint it wrote is checked (config.json quantization and mapping, one rank file per rank), as the
build job checks an engine directory. Otherwise (quantize.device cpu, or another target) the quantize
stage calls `quantize_job.run_job` in its own process and writes neither file.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pipeline.artifacts import CHECKPOINT_DIR, UNIFIED_HF_DIR
from pipeline.config.families import family_of
from pipeline.config.format_rules import needs_calibration
from pipeline.config.prequantized import PreQuantizedError
from pipeline.config.prequantized_targets import published_checkpoint
from pipeline.config.spec import BuildRunnerKind, QuantDevice, Spec
from pipeline.config.targets import traits_of
from pipeline.container_jobs import ContainerJob, JobRunner, Mount, RunnerUnavailable, Which
from pipeline.errors import StageError
from pipeline.quant_formats import recipe_quantization
from pipeline.quantization.job import (
    HF_QUANT_CONFIG,
    JOB_MODULE,
    REQUEST_FILE,
    RESULT_FILE,
    CalibrationRequest,
    QuantizeRequest,
    run_job,
)
from pipeline.quantization.trtllm_checkpoint.pretrained import checkpoint_mapping, pretrained_config
from pipeline.sources import package_dir
from pipeline.trtllm_versions import TrtllmVersion, get_version

SCRIPT_FILE = "quantize.sh"
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
    """The job's request, with every path absolute under `artifact_dir` (the directory the job will see).

    A published ModelOpt checkpoint that build.target serves as published (validate accepted it with quantize.algo and
    quantize.kv_cache none) becomes a pass-through: the request names the format it holds, `prequantized`, and no
    calibration. One that declares another format is refused here too: its codes are never read as plain weights."""
    from pipeline.calibration import calibration_files

    quantize = spec.quantize
    published = _published(spec, Path(hf_dir))
    if published is not None:
        return _published_request(spec, Path(hf_dir), Path(artifact_dir).resolve(), published, result_file=result_file)
    calibration = None
    if needs_calibration(quantize):
        c = quantize.calibration
        files = tuple(f.resolve() for f in calibration_files(c))
        calibration = CalibrationRequest(files, c.num_samples, c.max_seq_len, c.batch_size, c.seed)
    artifact_dir = Path(artifact_dir).resolve()
    checkpoint_config, unified_only = checkpoint_request(spec, Path(hf_dir))
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
        checkpoint_config=checkpoint_config,
        unified_only=unified_only,
    )


def _published(spec: Spec, hf_dir: Path):
    try:
        published = published_checkpoint(hf_dir, spec.build.target)
    except PreQuantizedError as exc:
        if spec.dry_run:  # no weights to mis-read in a dry run (a config-only example); validate refuses them once there
            return None
        raise StageError(f"quantize: {exc}", hint="run `trtllm-pipeline validate` on the config: it says what would work (docs/prequantized.md)") from None
    if published is not None and (spec.quantize.algo.value != "none" or spec.quantize.kv_cache.value != "none"):
        raise StageError(
            f"quantize: {published[0].where}: the checkpoint is pre-quantized ({published[0].label}); quantize.algo "
            f"{spec.quantize.algo.value} / quantize.kv_cache {spec.quantize.kv_cache.value} would re-quantize quantized codes",
            hint="set both to none to serve it as published",
        )
    return published


def _published_request(spec: Spec, hf_dir: Path, artifact_dir: Path, published, *, result_file: bool) -> QuantizeRequest:
    found, algo, kv = published
    checkpoint_config, _ = checkpoint_request(spec, hf_dir, recipe=(algo, kv))
    return QuantizeRequest(
        hf_dir=hf_dir.resolve(),
        output_dir=artifact_dir / CHECKPOINT_DIR,
        dtype=spec.model.dtype.value,
        tp_size=spec.build.tp_size,
        pp_size=spec.build.pp_size,
        algo=algo,
        kv_cache=kv,
        group_size=found.group_size or spec.quantize.group_size,
        device=spec.quantize.device.value,
        calibration=None,
        result_file=artifact_dir / RESULT_FILE if result_file else None,
        checkpoint_config=checkpoint_config,
        prequantized=True,
    )


def checkpoint_request(spec: Spec, hf_dir: Path, *, recipe: tuple[str, str] | None = None) -> tuple[dict[str, Any] | None, bool]:
    """(the TensorRT-LLM checkpoint config the job converts to, whether it writes only the unified checkpoint).

    The llmapi target takes families outside TensorRT-LLM's MODEL_MAP (DeepSeek-V3, GPT-OSS, Llama 4) as their
    unified checkpoint alone; every other case converts, with the family's config (the job cannot read the family
    table inside NVIDIA's image). A quantize.algo the family table refuses for the family on build.target is refused
    (StageError naming both). No readable config.json: (None, False), and the job reports it when it loads.
    `recipe`: the (quantize.algo, quantize.kv_cache) a published checkpoint holds, instead of the spec's.
    """
    try:
        hf = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    family = family_of(str(hf.get("model_type")))
    algo, kv = recipe or (spec.quantize.algo.value, spec.quantize.kv_cache.value)
    why = family.format_refusal(spec.build.target, algo) if family is not None else None
    if family is not None and why:  # validate refuses it first; the job in NVIDIA's image cannot read the table, so it is refused here too
        raise StageError(
            f"{family.name} in quantize.algo {algo} is refused on build.target {spec.build.target.value}: {why}",
            hint="pick a format the family table takes (docs/targets.md: Model families)",
        )
    if family is None or family.trtllm_class is None:
        if traits_of(spec.build.target).exports_unified_hf:
            return None, True
        what = "is not in the family table" if family is None else f"({family.name}) is not in TensorRT-LLM 1.2's MODEL_MAP"
        raise StageError(
            f"{hf_dir / 'config.json'}: model_type {hf.get('model_type')!r} {what}, so it has no TensorRT-LLM checkpoint to quantize into",
            hint="build.target llmapi takes its unified checkpoint",
        )
    config = pretrained_config(
        hf,
        dtype=spec.model.dtype.value,
        mapping=checkpoint_mapping(spec.build.tp_size, spec.build.pp_size),
        quantization=recipe_quantization(algo, kv),
    )
    return config, False


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


def job_for(spec: Spec, request: QuantizeRequest, artifact_dir: Path, work_dir: Path) -> QuantizeJob:
    return QuantizeJob(spec.name, request, Path(artifact_dir), Path(work_dir), get_version(spec.build.trtllm_version))


def run_quantize(
    job: QuantizeJob,
    runner: JobRunner,
    *,
    log: Callable[[str], None] | None = None,
    cuda_available: Callable[[], bool] | None = None,
    source_dir: Path | None = None,
) -> QuantizeOutcome:
    """Write the request and `quantize.sh`, run the job through `runner` (unless a dry run), check what it wrote."""
    container = container_job(job, log=log, cuda_available=cuda_available, source_dir=source_dir)
    # A dry run of a cpu-device job names no `docker run`: that job runs in this process.
    docker_command = None if runner.dry_run and job.request.device != "cuda" else runner.docker_command(container)
    if runner.dry_run:
        write_job_inputs(job, docker_command)
        return QuantizeOutcome(True, job.argv, None, docker_command=docker_command)
    runner.check(container)
    write_job_inputs(job, docker_command)
    output = runner.run(container)
    check_checkpoint_output(job.request)
    return QuantizeOutcome(False, runner.command(container), read_result(job.request), output, docker_command)


def container_job(
    job: QuantizeJob,
    *,
    log: Callable[[str], None] | None = None,
    cuda_available: Callable[[], bool] | None = None,
    source_dir: Path | None = None,
) -> ContainerJob:
    """The job as NVIDIA's image runs it (which ships torch, transformers and ModelOpt), or this process on its GPU."""
    return ContainerJob(
        argv=job.argv,
        image=job.version.image,
        work_dir=job.artifact_dir,
        mounts=_mounts(job, source_dir or package_dir("pipeline").resolve()),
        env=(("PYTHONPATH", CONTAINER_SOURCE), ("PYTHONDONTWRITEBYTECODE", "1"), ("HF_HUB_OFFLINE", "1")),
        check_host=partial(_check_cuda_here, job.request, cuda_available or _torch_cuda_available),
        run_here=partial(run_job, job.request, log=log),
    )


def _mounts(job: QuantizeJob, source_dir: Path) -> tuple[Mount, ...]:
    """Our package, the HF checkpoint, the calibration files (unless under an earlier mount), the artifact."""
    r = job.request
    inputs = [Mount(r.hf_dir, r.hf_dir)]
    for path in r.calibration.files if r.calibration is not None else ():
        if not any(path == m.host or str(path).startswith(f"{m.host}/") for m in inputs):
            inputs.append(Mount(path, path))
    return (Mount(source_dir, Path(CONTAINER_SOURCE) / "pipeline"), *inputs, Mount(job.artifact_dir, job.artifact_dir, read_only=False))


def _check_cuda_here(request: QuantizeRequest, cuda_available: Callable[[], bool], which: Which) -> None:
    if request.device == "cuda" and not cuda_available():
        raise RunnerUnavailable(
            "quantize.device is cuda with build.runner local, but torch sees no CUDA device on this host",
            hint="run on a GPU host, use --runner docker (the GPU is in the container) or --runner dry-run, or set quantize.device: cpu",
        )


def _torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# -- the job's files ------------------------------------------------------------------------------------
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
        (
            f"# quantize job for {job.name}: {r.algo} weights, {r.kv_cache} KV cache, calibrated on {r.device}; "
            f"TensorRT-LLM checkpoint (tp={r.tp_size}, pp={r.pp_size}) for TensorRT-LLM {v.version}"
        ),
        f"# request: {job.request_path}",
        "# rendered by trtllm-pipeline. Needs this project's pipeline/ package importable, with torch (CUDA),",
        "# transformers and nvidia-modelopt (export_hf_checkpoint), as in NVIDIA's image:",
        f"#   {v.image}",
    ]
    if docker_command is not None:
        lines += ["# In that image, as `--runner docker` runs it:", f"#   {shlex.join(docker_command)}"]
    lines += ["set -euo pipefail", shlex.join(job.argv)]
    return "\n".join(lines) + "\n"


def check_checkpoint_output(request: QuantizeRequest) -> dict[str, Any]:
    """After a real job: config.json with the requested quantization and mapping, and one rank file per rank (or, for a
    unified-only job, the unified checkpoint's config.json and its hf_quant_config.json's algorithms)."""
    if request.unified_only:
        if request.unified_hf_dir is None:  # QuantizeRequest.from_json refuses this
            raise StageError("the quantize request is unified_only but names no unified_hf_dir")
        return _check_unified_output(request, request.unified_hf_dir)
    path = request.output_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"the quantize job finished but {path} is missing or unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise StageError(f"the quantize job finished but {path} is not a JSON object")
    quant, mapping = config.get("quantization") or {}, config.get("mapping") or {}
    expected = recipe_quantization(request.algo, request.kv_cache)
    found = {
        **{f"quantization.{key}": (quant.get(key), want) for key, want in expected.items()},
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


def _check_unified_output(request: QuantizeRequest, directory: Path) -> dict[str, Any]:
    if not (directory / "config.json").is_file():
        raise StageError(f"the quantize job finished but {directory} holds no config.json (the unified checkpoint)")
    path = directory / HF_QUANT_CONFIG
    try:
        found = json.loads(path.read_text(encoding="utf-8")).get("quantization") or {} if path.is_file() else {}
    except (OSError, ValueError, AttributeError) as exc:
        raise StageError(f"the quantize job finished but {path} is unreadable ({exc})") from None
    want = recipe_quantization(request.algo, request.kv_cache, unified=True)
    got = {key: found.get(key) for key in want}
    if got != want:
        raise StageError(f"the quantize job wrote {path} that does not match its request: {got}, expected {want}")
    return got


def read_result(request: QuantizeRequest) -> dict[str, Any]:
    if request.result_file is None:
        raise StageError("the quantize job finished but its result None is missing or unreadable (the request names no result_file)")
    try:
        result = json.loads(request.result_file.read_text(encoding="utf-8"))
    except (OSError, TypeError, ValueError) as exc:
        raise StageError(f"the quantize job finished but its result {request.result_file} is missing or unreadable ({exc})") from None
    if not isinstance(result, dict) or not isinstance(result.get("quantization"), dict):
        raise StageError(f"{request.result_file}: not a quantize job result")
    return result

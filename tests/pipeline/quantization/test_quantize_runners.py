"""The quantize job through the container-job runners: quantize.device cuda on the engine target goes through the build runner.

No GPU here: the docker command is checked exactly, the docker runner runs against a fake `docker`, the
dry run is checked against what the docker runner would run, and the job module's main path runs on the
CPU (forced with --device cpu). The cuda device path itself (ModelOpt calibrating on a GPU, in this
process or in NVIDIA's image) cannot run on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.artifacts import ArtifactStore
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.container_jobs import DockerRunner, LocalRunner, RunnerUnavailable
from pipeline.errors import StageError, ToolError
from pipeline.preflight import preflight
from pipeline.quantization.dispatch import (
    SCRIPT_FILE,
    QuantizeJob,
    check_checkpoint_output,
    container_job,
    run_quantize,
)
from pipeline.quantization.job import (
    JOB_MODULE,
    REQUEST_FILE,
    RESULT_FILE,
    CalibrationRequest,
    QuantizeRequest,
)
from pipeline.runner import make_plan, run_pipeline
from pipeline.sources import package_dir
from pipeline.trtllm_versions import get_version
from tests.conftest import BUILD_CONFIGS, DEFAULT_MODEL, REPO

V121 = get_version("1.2.1")
PIPELINE_DIR = package_dir("pipeline").resolve()  # mounted read-only into the container
CALIB = REPO / "data" / "calibration" / "stdlib_calib.txt"
# The default model on the engine target, quantized on cuda through the dry-run runner.
TINY_FP8 = """\
name: tiny-job
model:
  source: {model}
quantize:
  algo: fp8
  kv_cache: fp8
  device: cuda
  calibration:
    files: ["{calib}"]
    num_samples: 16
    max_seq_len: 128
    batch_size: 8
build:
  target: engine
  runner: dry-run
  max_input_len: 256
  max_seq_len: 512
  max_num_tokens: 1024
"""


def _request(tmp_path: Path, **changes) -> QuantizeRequest:
    art = tmp_path / "quantize-0123"
    request = QuantizeRequest(
        hf_dir=tmp_path / "prepare-abcd",
        output_dir=art / "trtllm_checkpoint",
        dtype="bfloat16",
        tp_size=2,
        pp_size=1,
        algo="fp8",
        kv_cache="fp8",
        group_size=128,
        device="cuda",
        calibration=CalibrationRequest((tmp_path / "calib" / "a.txt", tmp_path / "calib" / "b.jsonl"), 64, 256, 8, 3),
        result_file=art / RESULT_FILE,
    )
    return dataclasses.replace(request, **changes)


def _job(tmp_path: Path, request: QuantizeRequest | None = None) -> QuantizeJob:
    request = request or _request(tmp_path)
    art = request.output_dir.parent
    return QuantizeJob("llama-fp8", request, art, art, V121)


# -- docker ---------------------------------------------------------------------------------------------
def test_docker_command_is_exact(tmp_path: Path) -> None:
    job = _job(tmp_path)
    runner = DockerRunner(gpus=(0, 1), shm_size="8g", uid=1000, gid=1001)
    art, hf = str(job.artifact_dir), str(job.request.hf_dir)
    a, b = (str(f) for f in job.request.calibration.files)
    assert list(runner.command(container_job(job, source_dir=Path("/src/pipeline")))) == [
        "docker",
        "run",
        "--rm",
        "--gpus",
        '"device=0,1"',
        "--shm-size",
        "8g",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "-u",
        "1000:1001",
        "-e",
        "HOME=/tmp",
        "-e",
        "PYTHONPATH=/opt/trtllm-pipeline",
        "-e",
        "PYTHONDONTWRITEBYTECODE=1",
        "-e",
        "HF_HUB_OFFLINE=1",
        "--network",
        "none",
        "-v",
        "/src/pipeline:/opt/trtllm-pipeline/pipeline:ro",
        "-v",
        f"{hf}:{hf}:ro",
        "-v",
        f"{a}:{a}:ro",
        "-v",
        f"{b}:{b}:ro",
        "-v",
        f"{art}:{art}",
        "-w",
        art,
        "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3",
        "python3",
        "-m",
        "pipeline.quantization.job",
        "--request",
        f"{art}/{REQUEST_FILE}",
    ]


def test_docker_command_defaults(tmp_path: Path) -> None:
    """All GPUs, this user, our own package directory; no calibration mounts without calibration; files under the checkpoint mount once."""
    job = _job(tmp_path, _request(tmp_path, calibration=None))
    command = list(DockerRunner(image="registry.local/trtllm:1.2.1").command(container_job(job)))
    assert command[command.index("--gpus") + 1] == "all" and command[command.index("-u") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert f"{PIPELINE_DIR}:/opt/trtllm-pipeline/pipeline:ro" in command and (PIPELINE_DIR / "quantization" / "job.py").is_file()
    assert command.count("-v") == 3 and "registry.local/trtllm:1.2.1" in command
    inside = _request(tmp_path, calibration=CalibrationRequest((tmp_path / "prepare-abcd" / "calib.txt",), 8, 64, 8, 0))
    assert DockerRunner().command(container_job(_job(tmp_path, inside))).count("-v") == 3


def _fake_checkpoint(request: QuantizeRequest, *, quant_algo: str = "FP8") -> None:
    request.output_dir.mkdir(parents=True, exist_ok=True)
    world = request.tp_size * request.pp_size
    config = {
        "mapping": {"world_size": world, "tp_size": request.tp_size, "pp_size": request.pp_size},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": "FP8"},
    }
    (request.output_dir / "config.json").write_text(json.dumps(config))
    for r in range(world):
        (request.output_dir / f"rank{r}.safetensors").write_bytes(b"")
    result = {
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": "FP8", "ranks": ["rank0.safetensors", "rank1.safetensors"]},
        "calibration": None,
        "device": "cuda:0 (NVIDIA H200)",
        "versions": {"modelopt": "0.37.0"},
    }
    request.result_file.write_text(json.dumps(result))


def test_docker_runner_runs_the_job_and_checks_the_checkpoint(tmp_path: Path) -> None:
    job = _job(tmp_path)
    calls = []

    def fake(command, **_):
        calls.append(command)
        if command[:2] == ["docker", "run"]:
            assert (job.work_dir / REQUEST_FILE).is_file() and (job.work_dir / SCRIPT_FILE).is_file()
            _fake_checkpoint(job.request)
        return "28.2.2\n" if command[:2] == ["docker", "info"] else "done"

    runner = DockerRunner(which=lambda name: "/usr/bin/docker", run_command=fake, uid=1, gid=2)
    outcome = run_quantize(job, runner)
    assert [c[:2] for c in calls] == [["docker", "info"], ["docker", "run"]]
    assert outcome.command == runner.command(container_job(job)) == tuple(calls[1]) == outcome.docker_command and not outcome.dry_run
    assert outcome.result["device"] == "cuda:0 (NVIDIA H200)" and outcome.log == "done"
    assert QuantizeRequest.read(job.work_dir / REQUEST_FILE) == job.request
    assert f"#   {shlex.join(outcome.command)}" in (job.work_dir / SCRIPT_FILE).read_text()


def test_docker_runner_refuses_a_checkpoint_that_does_not_match(tmp_path: Path) -> None:
    job = _job(tmp_path)
    runner = DockerRunner(which=lambda name: "/x/docker", run_command=lambda c, **_: _fake_checkpoint(job.request, quant_algo="W4A16_AWQ") or "1")
    with pytest.raises(StageError, match=r"quantization\.quant_algo is 'W4A16_AWQ', the request asks for 'FP8'"):
        run_quantize(job, runner)
    _fake_checkpoint(job.request)
    (job.request.output_dir / "rank1.safetensors").unlink()
    with pytest.raises(StageError, match=r"lacks rank1\.safetensors \(world size 2\)"):
        check_checkpoint_output(job.request)


def test_docker_runner_without_docker_refuses_before_writing(tmp_path: Path) -> None:
    job = _job(tmp_path)

    def failing(command, **_):
        raise ToolError(command, 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")

    with pytest.raises(RunnerUnavailable, match=r"docker is not installed"):
        run_quantize(job, DockerRunner(which=lambda name: None))
    with pytest.raises(RunnerUnavailable, match=r"not reachable \(Cannot connect"):
        run_quantize(job, DockerRunner(which=lambda name: "/x/docker", run_command=failing))
    assert not job.work_dir.exists()


# -- local ----------------------------------------------------------------------------------------------
def test_local_runner_refuses_cuda_without_a_cuda_device(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(RunnerUnavailable) as info:
        run_quantize(job, LocalRunner(run_command=_no_command), cuda_available=lambda: False)
    assert "quantize.device is cuda with build.runner local, but torch sees no CUDA device" in info.value.message
    assert "--runner docker" in info.value.hint and not job.work_dir.exists()


def test_local_runner_runs_the_job_in_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No subprocess: the job's log goes to the stage's log; then the checkpoint and the result file are checked."""
    job = _job(tmp_path)
    seen = []

    def run_job(request, *, log=None):
        seen.append(request)
        log("calibrating")
        _fake_checkpoint(request)
        return {}

    monkeypatch.setattr("pipeline.quantization.dispatch.run_job", run_job)
    logged: list[str] = []
    outcome = run_quantize(job, LocalRunner(run_command=_no_command), log=logged.append, cuda_available=lambda: True)
    assert seen == [job.request] and logged == ["calibrating"] and (job.work_dir / SCRIPT_FILE).is_file()
    assert outcome.command == job.argv and outcome.docker_command is None and outcome.result["device"] == "cuda:0 (NVIDIA H200)"
    assert "docker run" not in (job.work_dir / SCRIPT_FILE).read_text()


def _no_command(*_args, **_kwargs):
    raise AssertionError("the local runner runs the quantize job in this process")


# -- dry run --------------------------------------------------------------------------------------------
def _dry_run(tmp_path: Path, config: str = "llama-3.1-8b-fp8", *extra: str) -> Path:
    artifacts = tmp_path / "artifacts"
    assert main(["--artifacts", str(artifacts), "run", str(BUILD_CONFIGS / f"{config}.yaml"), "--runner", "dry-run", "--until", "quantize", *extra]) == 0
    [quantize] = (artifacts / config).glob("quantize-*")
    return quantize


def test_dry_run_writes_the_script_and_request_the_docker_runner_would_run(tmp_path: Path) -> None:
    quantize = _dry_run(tmp_path)
    assert sorted(p.name for p in quantize.iterdir()) == ["manifest.json", "quantize.json", SCRIPT_FILE, REQUEST_FILE]
    request = QuantizeRequest.read(quantize / REQUEST_FILE)
    [prepare] = (tmp_path / "artifacts" / "llama-3.1-8b-fp8").glob("prepare-*")
    # the final artifact paths (not the temporary ones), and every value from the build config
    assert request.output_dir == quantize / "trtllm_checkpoint" and request.result_file == quantize / RESULT_FILE
    assert request.hf_dir == prepare and request.device == "cuda" and (request.algo, request.kv_cache, request.dtype) == ("fp8", "fp8", "bfloat16")
    assert request.calibration == CalibrationRequest((CALIB,), 512, 512, 8, 0)

    script = quantize / SCRIPT_FILE
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    lines = script.read_text().splitlines()
    job = QuantizeJob("llama-3.1-8b-fp8", request, quantize, quantize, V121)
    assert shlex.split(lines[-1]) == list(job.argv) == ["python3", "-m", JOB_MODULE, "--request", str(quantize / REQUEST_FILE)]
    docker_line = lines[lines.index("# In that image, as `--runner docker` runs it:") + 1]
    expected = list(DockerRunner(gpus=(0,), shm_size="4g").command(container_job(job)))  # deploy.gpus [0], deploy.shm_size 4g
    assert shlex.split(docker_line.removeprefix("#   ")) == expected and expected[-len(job.argv) :] == list(job.argv)

    record = json.loads((quantize / "quantize.json").read_text())
    assert record["dry_run"] is True and record["command"] == list(job.argv) and record["docker_command"] == expected
    manifest = json.loads((quantize / "manifest.json").read_text())
    assert manifest["notes"]["runner"] == "dry-run" and manifest["notes"]["command"] == list(job.argv)


def test_dry_run_on_cpu_writes_the_job_without_docker(tmp_path: Path) -> None:
    quantize = _dry_run(tmp_path, "mistral-7b-int8-sq", "--set", "quantize.device=cpu")
    assert QuantizeRequest.read(quantize / REQUEST_FILE).device == "cpu"
    assert "docker run" not in (quantize / SCRIPT_FILE).read_text()
    assert json.loads((quantize / "quantize.json").read_text())["docker_command"] is None


# -- preflight ------------------------------------------------------------------------------------------
def _issues(config: str, *overrides: str, stages=("prepare", "quantize")) -> list[str]:
    loaded = load_config(BUILD_CONFIGS / f"{config}.yaml", list(overrides))
    return [message for _path, message in preflight(loaded.spec, loaded.model, stages)]


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.preflight.cuda_available", lambda: False)


@pytest.fixture
def docker_engine(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A reachable Docker engine, as far as the preflight can tell."""
    probes: list[str] = []
    monkeypatch.setattr("pipeline.container_jobs.check_docker_engine", lambda which, run: probes.append("docker info") or "28.2.2")
    return probes


def _tiny_issues(tmp_path: Path, *overrides: str) -> list[str]:
    """The default model (it has a tokenizer, so calibration is checked too) on the engine target with quantize.device cuda."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_FP8.format(model=DEFAULT_MODEL, calib=CALIB))
    loaded = load_config(path, list(overrides))
    return [message for _path, message in preflight(loaded.spec, loaded.model, ("prepare", "quantize"))]


def test_preflight_cuda_with_docker_needs_no_cuda_here(tmp_path: Path, no_cuda, docker_engine) -> None:
    assert _tiny_issues(tmp_path, "build.runner=docker") == [] and docker_engine == ["docker info"]
    assert _tiny_issues(tmp_path, "build.runner=docker", "quantize.algo=nvfp4") == []  # NVFP4 calibrates on the container's GPU
    assert _tiny_issues(tmp_path, "build.runner=local", "quantize.algo=nvfp4")[0].startswith("quantize.device is cuda, but this machine has no CUDA")


def test_preflight_cuda_with_docker_needs_a_docker_engine(no_cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(which, run):
        raise RunnerUnavailable("docker is not installed (no `docker` on PATH)")

    monkeypatch.setattr("pipeline.container_jobs.check_docker_engine", missing)
    assert _issues("llama-3.1-8b-fp8", "build.runner=docker") == [
        "quantize.device cuda runs the quantize job with build.runner docker: docker is not installed (no `docker` on PATH)"
    ]


def test_preflight_cuda_with_dry_run_is_fine(no_cuda) -> None:
    assert _issues("llama-3.1-8b-fp8", "build.runner=dry-run") == []


def test_preflight_cuda_with_local_needs_cuda_here(no_cuda) -> None:
    assert _issues("llama-3.1-8b-fp8", "build.runner=local") == [
        (
            "quantize.device is cuda, but this machine has no CUDA device: with build.runner local ModelOpt calibrates in this "
            "process; use --runner docker (the GPU is in the container) or --runner dry-run, or set quantize.device: cpu"
        )
    ]


def test_preflight_cuda_on_the_cpu_target(tmp_path: Path, no_cuda) -> None:
    path = tmp_path / "c.yaml"
    path.write_text((BUILD_CONFIGS / "tiny-cpu.yaml").read_text().replace("../models/tiny-stdlib-llama", str(DEFAULT_MODEL)))
    loaded = load_config(path, ["quantize.device=cuda"])
    assert [m for _, m in preflight(loaded.spec, loaded.model, ("quantize",))] == [
        "quantize.device is cuda, but this machine has no CUDA device: build.target cpu quantizes in this process; set quantize.device: cpu"
    ]


# -- the plan digest ------------------------------------------------------------------------------------
def _quantize_digest(*overrides: str) -> str:
    return make_plan(load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml", list(overrides))).stage("quantize").digest


def test_quantize_digest_follows_where_the_job_runs() -> None:
    local, docker = _quantize_digest("build.runner=local"), _quantize_digest("build.runner=docker")
    assert local != docker  # the image's torch/ModelOpt write the checkpoint, not this host's
    assert _quantize_digest("build.runner=docker", "build.trtllm_version=1.1.0") != docker  # another image
    assert _quantize_digest("build.runner=local", "build.trtllm_version=1.1.0") == local
    assert _quantize_digest("build.runner=docker", "deploy.shm_size=8g") == docker  # how it runs, not what it makes
    # on the CPU the job runs in this process whatever the build runner
    assert _quantize_digest("build.runner=local", "quantize.device=cpu") == _quantize_digest("build.runner=docker", "quantize.device=cpu")
    dry = _quantize_digest("build.runner=dry-run")
    assert _quantize_digest("build.runner=dry-run", "deploy.shm_size=8g") != dry  # quantize.sh shows the docker run


# -- the job module on this CPU ---------------------------------------------------------------------------
@pytest.mark.slow
def test_the_job_module_runs_here_on_cpu_and_writes_what_the_in_process_path_writes(tmp_path: Path) -> None:
    """The dry run's quantize.sh command, run with --device cpu, against the default model through the prepare stage.

    Only the job module's own path is proven here; calibrating on cuda (its real use) cannot run on this machine.
    """
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_FP8.format(model=DEFAULT_MODEL, calib=CALIB))
    quiet = Console(quiet=True)
    store = ArtifactStore(tmp_path / "artifacts", "tiny-job")
    dry = {r.name: r for r in run_pipeline(load_config(path), store, until="quantize", console=quiet)}
    quantize = dry["quantize"].ref.path
    argv = shlex.split((quantize / SCRIPT_FILE).read_text().splitlines()[-1])
    assert argv[:3] == ["python3", "-m", JOB_MODULE]
    env = {**os.environ, "PYTHONPATH": str(PIPELINE_DIR.parent)}  # as in the container: our package on PYTHONPATH
    done = subprocess.run([sys.executable, *argv[1:], "--device", "cpu"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "device cpu instead of the request's cuda" in done.stderr
    request = QuantizeRequest.read(quantize / REQUEST_FILE)
    check_checkpoint_output(request)
    result = json.loads((quantize / RESULT_FILE).read_text())
    assert result == json.loads(done.stdout.splitlines()[-1]) and result["device"] == "cpu"

    # the in-process path: the same config quantized on this CPU by the quantize stage itself
    in_process = {r.name: r for r in run_pipeline(load_config(path, ["quantize.device=cpu", "build.runner=local"]), store, until="quantize", console=quiet)}
    reference = in_process["quantize"].ref
    assert (
        reference.manifest["notes"]["quantization"]
        == result["quantization"]
        == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "ranks": ["rank0.safetensors"]}
    )
    assert reference.manifest["notes"]["calibration"] == result["calibration"]
    job_files = sorted(p.name for p in request.output_dir.iterdir())
    assert job_files == sorted(p.name for p in (reference.path / "trtllm_checkpoint").iterdir()) == ["config.json", "rank0.safetensors"]
    for name in job_files:
        assert (request.output_dir / name).read_bytes() == (reference.path / "trtllm_checkpoint" / name).read_bytes(), name

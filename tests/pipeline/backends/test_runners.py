"""trtllm-build through the container-job runners: docker refuses cleanly without an engine, local needs
trtllm-build, dry-run needs no weights; every docker run gets the one flag set (no network)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from pipeline.backends.engine.build_job import DRY_RUN_FILE, build_job, is_dry_run, run_build
from pipeline.backends.engine.trtllm_build import SCRIPT_FILE, plan_trtllm_build
from pipeline.backends.engine_facts import engine_facts
from pipeline.config.loader import load_config
from pipeline.container_jobs import (
    DockerRunner,
    DryRunRunner,
    LocalRunner,
    RunnerUnavailable,
    make_runner,
)
from pipeline.errors import SpecError, StageError, ToolError
from pipeline.trtllm_versions import get_version
from tests.conftest import BUILD_CONFIGS

V121 = get_version("1.2.1")


def _build(tmp_path: Path, config: str = "llama-3.1-8b-fp8"):
    loaded = load_config(BUILD_CONFIGS / f"{config}.yaml")
    return plan_trtllm_build(loaded.spec, loaded.model, tmp_path / "ckpt", tmp_path / "engine", V121)


def _write_checkpoint(build, *, quant_algo="FP8", kv="FP8", tp=1, ranks=True) -> None:
    build.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "vocab_size": 128256,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv},
    }
    (build.checkpoint_dir / "config.json").write_text(json.dumps(config))
    if ranks:
        for r in range(tp):
            (build.checkpoint_dir / f"rank{r}.safetensors").write_bytes(b"")


def _fail(*_args, **_kwargs):
    raise AssertionError("no command may run")


# -- docker ---------------------------------------------------------------------------------------------
def test_docker_runner_refuses_here_without_an_engine(tmp_path):
    """This machine has at most the docker client: the runner must say so before writing anything."""
    build = _build(tmp_path)
    _write_checkpoint(build)
    runner = DockerRunner()
    if shutil.which("docker") is None:
        expected = "docker is not installed"
    else:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.strip():
            pytest.skip("a Docker engine is reachable on this machine")
        expected = "the Docker engine is not reachable"
    with pytest.raises(RunnerUnavailable, match=expected) as info:
        run_build(build, runner)
    assert "--runner dry-run" in info.value.hint
    assert not build.output_dir.exists()


def test_docker_runner_without_client(tmp_path):
    runner = DockerRunner(which=lambda name: None, run_command=_fail)
    with pytest.raises(RunnerUnavailable, match=r"docker is not installed \(no `docker` on PATH\)"):
        run_build(_build(tmp_path), runner)


def test_docker_runner_names_the_engine_error(tmp_path):
    def unreachable(command, **_):
        raise ToolError(command, 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")

    runner = DockerRunner(which=lambda name: "/usr/bin/docker", run_command=unreachable)
    with pytest.raises(RunnerUnavailable, match=r"not reachable \(Cannot connect to the Docker daemon"):
        run_build(_build(tmp_path), runner)


def test_docker_command_pins_the_image_and_mounts(tmp_path):
    build = _build(tmp_path, "llama-3.3-70b-fp8-tp2")
    command = list(DockerRunner(gpus=(0, 1), shm_size="8g", uid=1000, gid=1001).command(build_job(build)))
    text = shlex.join(command)
    assert command[:3] == ["docker", "run", "--rm"]
    assert "--gpus '\"device=0,1\"'" in text and "--shm-size 8g" in text
    assert "--ulimit memlock=-1 --ulimit stack=67108864" in text and "-u 1000:1001" in text
    assert f"-v {build.checkpoint_dir}:{build.checkpoint_dir}:ro" in text and f"-v {build.output_dir}:{build.output_dir} " in text
    image_at = command.index(V121.image)
    assert command[image_at + 1 :] == list(build.argv)


def test_docker_build_runs_without_network_like_the_quantize_job(tmp_path):
    """One flag set for every job: trtllm-build reads only mounted files (its --checkpoint_dir, --build_config, --lora_dir), so no network either."""
    build = _build(tmp_path)
    command = list(DockerRunner(uid=1000, gid=1000).command(build_job(build)))
    assert command[:15] == [
        "docker",
        "run",
        "--rm",
        "--gpus",
        "all",
        "--shm-size",
        "2g",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "-u",
        "1000:1000",
        "-e",
        "HOME=/tmp",
    ]
    assert command[15:17] == ["--network", "none"] and command[command.index("-w") + 1] == str(build.output_dir)


def test_docker_command_defaults_to_all_gpus_and_accepts_an_image(tmp_path):
    command = list(DockerRunner(image="registry.local/trtllm:1.2.1").command(build_job(_build(tmp_path))))
    assert command[command.index("--gpus") + 1] == "all" and "registry.local/trtllm:1.2.1" in command


def test_docker_runner_runs_the_command_when_the_engine_answers(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build)
    calls = []

    def fake(command, **_):
        calls.append(command)
        if command[:2] == ["docker", "run"]:
            _fake_engine(build)
        return "28.2.2\n" if command[:2] == ["docker", "info"] else "built"

    outcome = run_build(build, DockerRunner(which=lambda name: "/usr/bin/docker", run_command=fake))
    assert [c[:2] for c in calls] == [["docker", "info"], ["docker", "run"]]
    assert not outcome.dry_run and outcome.log == "built" and (build.output_dir / "build_config.json").is_file()


# -- local ---------------------------------------------------------------------------------------------
def _fake_engine(build, version="1.2.1"):
    build.output_dir.mkdir(parents=True, exist_ok=True)
    (build.output_dir / "config.json").write_text(json.dumps({"version": version}))
    for r in range(build.settings.world_size):
        (build.output_dir / f"rank{r}.engine").write_bytes(b"plan")


def test_local_runner_needs_trtllm_build_on_path(tmp_path):
    with pytest.raises(RunnerUnavailable, match="trtllm-build is not on PATH"):
        run_build(_build(tmp_path), LocalRunner(which=lambda name: None, run_command=_fail))


def test_local_runner_needs_the_weights(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build, ranks=False)
    with pytest.raises(RunnerUnavailable, match=r"lacks rank0\.safetensors"):
        run_build(build, LocalRunner(which=lambda name: "/x/trtllm-build", run_command=_fail))


def test_local_runner_runs_the_exact_argv_through_the_seam(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build)
    seen = {}

    def fake(command, *, cwd=None, timeout=None, **_):
        seen.update(command=command, cwd=cwd)
        _fake_engine(build)
        return "ok"

    outcome = run_build(build, LocalRunner(which=lambda name: "/x/trtllm-build", run_command=fake))
    assert seen["command"] == list(build.argv) and seen["cwd"] == build.output_dir
    assert json.loads(build.build_config_path.read_text()) == build.build_config
    assert outcome.engine_dir == build.output_dir and not outcome.dry_run


def test_local_runner_refuses_an_engine_of_another_version(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build)
    runner = LocalRunner(which=lambda name: "/x/trtllm-build", run_command=lambda command, **_: _fake_engine(build, "1.1.0") or "")
    with pytest.raises(StageError, match="built by TensorRT-LLM 1.1.0, but the build pins 1.2.1"):
        run_build(build, runner)


def test_checkpoint_of_another_format_is_refused(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build, quant_algo="W4A16_AWQ", kv=None)
    with pytest.raises(StageError, match=r"quantization\.quant_algo is 'W4A16_AWQ', the build expects 'FP8'"):
        run_build(build, LocalRunner(which=lambda name: "/x/trtllm-build", run_command=_fail))


# -- dry run --------------------------------------------------------------------------------------------
def test_dry_run_needs_no_weights(tmp_path):
    build = _build(tmp_path, "llama-3.3-70b-fp8-tp2")
    outcome = run_build(build, DryRunRunner())
    assert outcome.dry_run and is_dry_run(build.output_dir)
    files = {p.name for p in build.output_dir.iterdir()}
    assert files == {"config.json", "build_config.json", SCRIPT_FILE, DRY_RUN_FILE}
    config = json.loads((build.output_dir / "config.json").read_text())
    assert set(config) == {"version", "pretrained_config", "build_config"}
    assert config["version"] == "1.2.1" and config["build_config"] == build.build_config
    pretrained = config["pretrained_config"]
    assert pretrained["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert pretrained["quantization"]["quant_algo"] == "FP8" and pretrained["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert pretrained["rotary_base"] == 500000.0 and pretrained["rotary_scaling"]["rope_type"] == "llama3"
    assert pretrained["num_key_value_heads"] == 8 and pretrained["head_size"] == 128
    marker = json.loads((build.output_dir / DRY_RUN_FILE).read_text())
    assert marker["dry_run"] is True and marker["missing"] == ["rank0.engine", "rank1.engine"]
    assert marker["pretrained_config_from"].startswith("Hugging Face")


def test_dry_run_engine_config_reads_like_an_engine(tmp_path):
    build = _build(tmp_path, "mistral-7b-int8-sq")
    run_build(build, DryRunRunner())
    facts = engine_facts(json.loads((build.output_dir / "config.json").read_text()))
    assert (facts.version, facts.quant_algo, facts.max_batch_size, facts.max_seq_len) == ("1.2.1", "W8A8_SQ_PER_CHANNEL", 64, 8192)
    assert facts.use_paged_context_fmha and facts.tokens_per_block == 32 and not facts.built_by_refengine


def test_dry_run_prefers_the_checkpoint_config(tmp_path):
    build = _build(tmp_path)
    _write_checkpoint(build, ranks=False)
    run_build(build, DryRunRunner())
    assert json.loads((build.output_dir / "config.json").read_text())["pretrained_config"]["vocab_size"] == 128256
    assert json.loads((build.output_dir / DRY_RUN_FILE).read_text())["pretrained_config_from"] == "checkpoint config.json"


def test_dry_run_script_is_executable_bash_with_the_argv(tmp_path):
    build = _build(tmp_path)
    run_build(build, DryRunRunner())
    script = build.output_dir / SCRIPT_FILE
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    text = script.read_text()
    assert all(shlex.quote(token) in text for token in build.argv)


def test_make_runner_choices(tmp_path):
    assert isinstance(make_runner("dry-run"), DryRunRunner) and isinstance(make_runner("local"), LocalRunner)
    runner = make_runner("docker", gpus=[1], shm_size="4g")
    assert isinstance(runner, DockerRunner) and runner.gpus == (1,) and runner.uid == os.getuid()
    dry = make_runner("dry-run", gpus=[3], shm_size="16g")
    assert dry.dry_run and dry.docker.gpus == (3,) and dry.docker.shm_size == "16g"  # the command a dry run's script names
    with pytest.raises(SpecError, match="build runner 'ssh' is not one of local, docker, dry-run"):
        make_runner("ssh")


# -- LoRA adapters and speculative decoding ---------------------------------------------------------------
def test_docker_command_mounts_the_lora_adapters_read_only(tmp_path):
    build = _build(tmp_path, "llama-3.1-8b-fp8-lora")
    [adapter] = build.settings.lora_dirs
    text = shlex.join(list(DockerRunner(uid=1000, gid=1000).command(build_job(build))))
    assert f"-v {adapter}:{adapter}:ro" in text and f"--lora_dir {adapter}" in text


def test_real_runners_need_the_adapter_weights(tmp_path):
    build = _build(tmp_path, "llama-3.1-8b-fp8-lora")  # the example adapter has only adapter_config.json
    _write_checkpoint(build)
    with pytest.raises(RunnerUnavailable, match=r"LoRA adapter .*llama-3.1-8b-lora-example lacks adapter_model\.safetensors"):
        run_build(build, LocalRunner(which=lambda name: "/x/trtllm-build", run_command=_fail))


def test_dry_run_records_the_engine_as_trtllm_build_would(tmp_path):
    lora = _build(tmp_path / "lora", "llama-3.1-8b-fp8-lora")
    run_build(lora, DryRunRunner())
    facts = engine_facts(json.loads((lora.output_dir / "config.json").read_text()))
    assert facts.lora_plugin == "bfloat16" and facts.max_lora_rank == 32 and facts.lora_target_modules == ("attn_q", "attn_k", "attn_v", "attn_dense")
    assert json.loads((lora.output_dir / "config.json").read_text())["build_config"]["lora_config"]["lora_dir"] == ["lora/0"]
    assert json.loads((lora.output_dir / DRY_RUN_FILE).read_text())["missing"] == ["rank0.engine", "lora/0/"]
    lookahead = _build(tmp_path / "lookahead", "llama-3.1-8b-fp8-lookahead")
    run_build(lookahead, DryRunRunner())
    facts = engine_facts(json.loads((lookahead.output_dir / "config.json").read_text()))
    assert (facts.speculative_decoding_mode, facts.max_draft_len, facts.max_seq_len, facts.usable_seq_len) == ("lookahead_decoding", 15, 8207, 8192)
    assert json.loads((lookahead.output_dir / "build_config.json").read_text())["max_seq_len"] == 8192  # trtllm-build adds the 15

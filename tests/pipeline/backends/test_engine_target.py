"""The engine target wired into the pipeline: dry runs on a CPU machine, and every bad input refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import BUILD_CONFIGS

GPU_CONFIGS = [
    "llama-3.1-8b-fp8",
    "llama-3.1-8b-int4-awq",
    "llama-3.3-70b-fp8-tp2",
    "mistral-7b-int8-sq",
    "llama-3.1-8b-fp8-lora",
    "llama-3.1-8b-fp8-lookahead",
]


def _run(tmp_path: Path, config: str, *args: str) -> int:
    return main(["--artifacts", str(tmp_path / "artifacts"), "run", str(BUILD_CONFIGS / f"{config}.yaml"), *args])


@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_dry_run_renders_the_engine_directory_without_weights(tmp_path: Path, config: str) -> None:
    assert _run(tmp_path, config, "--runner", "dry-run") == 0
    [build] = (tmp_path / "artifacts" / config).glob("build-*")
    engine = build / "engine"
    assert sorted(p.name for p in engine.iterdir()) == ["build_config.json", "config.json", "dry_run.json", "trtllm-build.sh"]
    engine_config = json.loads((engine / "config.json").read_text())
    assert set(engine_config) == {"version", "pretrained_config", "build_config"} and engine_config["version"] == "1.2.1"
    script = (engine / "trtllm-build.sh").read_text()
    assert f"--output_dir {engine}" in script  # the final artifact path, not the temporary one
    manifest = json.loads((build / "manifest.json").read_text())
    assert manifest["notes"]["dry_run"] is True and manifest["notes"]["trtllm_version"] == "1.2.1"
    assert manifest["notes"]["command"][0] == "trtllm-build"


def test_dry_run_packages_lora_and_lookahead_repositories(tmp_path: Path) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    for config, key, value in (("llama-3.1-8b-fp8-lora", "lora_cache_max_adapter_size", "32"), ("llama-3.1-8b-fp8-lookahead", "decoding_mode", "lookahead")):
        assert _run(tmp_path, config, "--runner", "dry-run", "--until", "package") == 0
        [package] = (tmp_path / "artifacts" / config).glob("package-*")
        llm = model_config_pb2.ModelConfig()
        text_format.Parse((package / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text(), llm)
        assert llm.parameters[key].string_value == value


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, *args: str) -> str:
    assert _run(tmp_path, config, *args) == 2
    assert not (tmp_path / "artifacts").exists() or not any((tmp_path / "artifacts").rglob("manifest.json"))
    return capsys.readouterr().err


def test_fp8_on_a_declared_a100_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "llama-3.1-8b-fp8", "--runner", "dry-run", "--set", "deploy.gpu=A100-80GB")
    assert "quantize.algo fp8 needs FP8 tensor cores (SM >= 8.9" in err and "the GPU is SM 8.0" in err


def test_explicit_fp8_context_fmha_without_fp8_quantization(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="build.plugins.use_fp8_context_fmha: true needs quantize.algo fp8, w4a8_awq or nvfp4, got int8_sq"):
        load_config(BUILD_CONFIGS / "mistral-7b-int8-sq.yaml", ["build.plugins.use_fp8_context_fmha=true"])


def test_int8_kv_with_kv_reuse(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="serve.enable_kv_cache_reuse: true is not possible with quantize.kv_cache: int8"):
        load_config(BUILD_CONFIGS / "mistral-7b-int8-sq.yaml", ["quantize.kv_cache=int8"])


def test_opt_num_tokens_with_multiple_profiles() -> None:
    with pytest.raises(SpecError, match="build.opt_num_tokens cannot be set together with build.plugins.multiple_profiles"):
        load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml", ["build.opt_num_tokens=1024", "build.plugins.multiple_profiles=true"])


def test_tp_times_pp_must_match_the_deployed_gpus() -> None:
    with pytest.raises(SpecError, match=r"deploy.gpus lists 1 GPU\(s\) but build.tp_size \(2\)"):
        load_config(BUILD_CONFIGS / "llama-3.3-70b-fp8-tp2.yaml", ["deploy.gpus=[0]"])


def test_max_num_tokens_below_tokens_per_block() -> None:
    with pytest.raises(SpecError, match=r"build.max_num_tokens \(16\) must be at least build.tokens_per_block \(32\)"):
        load_config(BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml", ["build.max_num_tokens=16"])


def test_docker_runner_without_a_docker_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # no engine here even where dockerd runs (the compose e2e starts one): `docker info` honours DOCKER_HOST
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    err = _refused(tmp_path, capsys, "mistral-7b-int8-sq", "--runner", "docker", "--set", "quantize.device=cpu")
    assert "build.runner docker:" in err


def test_local_runner_without_trtllm_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "mistral-7b-int8-sq", "--runner", "local", "--set", "quantize.device=cpu")
    assert "build.runner local needs trtllm-build on PATH" in err


def test_unknown_trtllm_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "llama-3.1-8b-fp8", "--runner", "dry-run", "--set", "build.trtllm_version=0.9.0")
    assert "TensorRT-LLM version '0.9.0'" in err and "supported: 1.2.1, 1.1.0, 1.0.0" in err


def test_quantize_on_cuda_refused_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, "llama-3.1-8b-fp8", "--until", "quantize")
    assert "quantize.device is cuda, but this machine has no CUDA device" in err


def test_capacity_plan_and_impossible_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(BUILD_CONFIGS / "llama-3.3-70b-fp8-tp2.yaml")
    assert main(["plan", config, "--gpu", "H200"]) == 0
    assert "tokens in the KV cache" in capsys.readouterr().out
    assert main(["plan", config, "--gpu", "H100-80GB", "--tp", "1", "--set", "quantize.algo=none", "--set", "quantize.kv_cache=none"]) == 2
    assert "61.1 GB missing" in capsys.readouterr().err

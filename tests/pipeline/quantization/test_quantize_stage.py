"""The quantize stage: calibration control, fingerprints, per-target format rules, bad inputs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.artifacts import ArtifactStore
from pipeline.calibration import build_calibration_set, read_documents
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.config.spec import CalibrationSpec
from pipeline.errors import SpecError
from pipeline.runner import make_plan, run_pipeline
from tests.conftest import DEFAULT_MODEL, REPO, write_model_config

CALIB_TEXT = (REPO / "data" / "calibration" / "stdlib_calib.txt").read_text()


def _config(tmp_path: Path, quantize: str, *, target: str = "cpu", model: Path = DEFAULT_MODEL, extra: str = "") -> Path:
    (tmp_path / "calib").mkdir(exist_ok=True)
    (tmp_path / "calib" / "a.txt").write_text(CALIB_TEXT[:60_000])
    (tmp_path / "calib" / "b.jsonl").write_text("\n".join(json.dumps({"text": CALIB_TEXT[i : i + 5000]}) for i in range(60_000, 90_000, 5000)) + "\n")
    text = f"""\
    name: q
    model:
      source: {model}
    quantize:
{textwrap.indent(textwrap.dedent(quantize), "      ")}
    build:
      target: {target}
      max_input_len: 256
      max_seq_len: 512
      max_num_tokens: 1024
    """
    path = tmp_path / "q.yaml"
    path.write_text(textwrap.dedent(text) + extra)
    return path


FP8 = """\
algo: fp8
kv_cache: fp8
calibration:
  files: ["calib/*.txt", "calib/*.jsonl"]
  num_samples: 16
  max_seq_len: 128
  batch_size: 8
"""


def _error(path: Path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path, overrides)
    return info.value.message


def test_llmapi_refuses_engine_path_only_formats(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8.replace("algo: fp8", "algo: int8_sq").replace("kv_cache: fp8", "kv_cache: none"), target="llmapi")
    assert "quantize.algo int8_sq does not run on build.target llmapi" in _error(path)
    path = _config(
        tmp_path,
        FP8.replace("kv_cache: fp8", "kv_cache: int8"),
        target="llmapi",
        extra="serve:\n  enable_kv_cache_reuse: false\n  enable_chunked_context: false\n",
    )
    assert "quantize.kv_cache int8 does not run on build.target llmapi" in _error(path)


def test_int4_weight_only_is_refused_with_the_reason(tmp_path: Path) -> None:
    message = _error(_config(tmp_path, "algo: int4_wo\n"))
    assert "quantize.algo int4_wo is not offered" in message and "use int4_awq" in message


def test_nvfp4_is_refused_on_the_cpu_target(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8.replace("algo: fp8", "algo: nvfp4"))
    assert "quantize.algo nvfp4 needs build.target engine" in _error(path)


def test_nvfp4_on_the_engine_target_is_refused_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, FP8.replace("algo: fp8", "algo: nvfp4"), target="engine")
    load_config(path)  # a valid spec: it runs on a CUDA machine
    artifacts = tmp_path / "artifacts"
    assert main(["--artifacts", str(artifacts), "run", str(path), "--until", "quantize"]) == 2
    assert "NVFP4 calibration needs CUDA kernels, but this machine has no CUDA device" in capsys.readouterr().err
    assert not artifacts.exists()


def test_calibration_is_required_for_calibrated_formats(tmp_path: Path) -> None:
    path = _config(tmp_path, "algo: int4_awq\n")
    assert "quantize.calibration.files is empty, but quantize.algo int4_awq" in _error(path)
    load_config(_config(tmp_path, "algo: int8_wo\n"))  # weight-only INT8 needs no calibration


def test_calibration_glob_matching_nothing(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8.replace("calib/*.jsonl", "calib/*.csv"))
    message = _error(path)
    assert f"{path}:8: quantize.calibration.files.1: no file matches {tmp_path / 'calib' / '*.csv'}" in message


def test_calibration_text_shorter_than_one_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, FP8.replace("max_seq_len: 128", "max_seq_len: 32768"))
    artifacts = tmp_path / "artifacts"
    assert main(["--artifacts", str(artifacts), "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "fewer than one sample (quantize.calibration.max_seq_len 32768)" in err
    assert not artifacts.exists()


def test_awq_group_size_must_divide_hidden_size(tmp_path: Path) -> None:
    model = write_model_config(tmp_path / "wide", hidden_size=320, num_attention_heads=4, num_key_value_heads=2)
    path = _config(tmp_path, FP8.replace("algo: fp8", "algo: int4_awq").replace("kv_cache: fp8", "kv_cache: none"), model=model)
    assert "quantize.group_size (128) must divide the model's hidden_size (320) for quantize.algo int4_awq" in _error(path)
    assert "must be 64 or 128" in _error(path, "quantize.group_size=96")


def test_fp8_kv_with_int8_weights_disables_reuse_on_the_engine_target(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8.replace("algo: fp8", "algo: int8_sq"), target="engine")
    assert "serve.enable_kv_cache_reuse: true is not possible with quantize.kv_cache fp8 and quantize.algo int8_sq" in _error(path)


def test_calibration_windows_are_deterministic_and_fingerprinted(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text(" ".join(str(i) for i in range(300)))
    spec = CalibrationSpec(files=(str(tmp_path / "*.txt"),), num_samples=5, max_seq_len=50, seed=3)
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - a byte-level stand-in tokenizer
    first, again = build_calibration_set(spec, encode, 0), build_calibration_set(spec, encode, 0)
    assert first.windows == again.windows and first.fingerprint == again.fingerprint
    assert len(first.windows) == 5 and all(len(w) == 50 for w in first.windows)
    other_seed = build_calibration_set(spec.model_copy(update={"seed": 4}), encode, 0)
    assert other_seed.fingerprint != first.fingerprint


def test_jsonl_documents_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n"two"\n\n')
    assert read_documents(path) == ["one", "two"]
    path.write_text('{"text": "one"}\n{"txt": 3}\n')
    with pytest.raises(SpecError, match=r"d.jsonl:2: expected a string"):
        read_documents(path)


def test_changing_a_calibration_file_changes_the_quantize_digest_only(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8)
    before = {s.name: s.digest for s in make_plan(load_config(path)).stages}
    (tmp_path / "calib" / "a.txt").write_text(CALIB_TEXT[:59_000])
    after = {s.name: s.digest for s in make_plan(load_config(path)).stages}
    assert after["prepare"] == before["prepare"]
    assert after["quantize"] != before["quantize"] and after["build"] != before["build"]


@pytest.mark.slow
def test_fp8_quantize_records_the_calibration_fingerprint_and_hits_the_cache(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8)
    loaded = load_config(path)
    store = ArtifactStore(tmp_path / "artifacts", "q")
    quiet = Console(quiet=True)
    first = {r.name: r for r in run_pipeline(loaded, store, until="quantize", console=quiet)}
    notes = first["quantize"].ref.manifest["notes"]
    assert notes["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "ranks": ["rank0.safetensors"]}
    assert notes["calibration"]["num_samples"] == 16 and len(notes["calibration"]["token_ids_sha256"]) == 64
    assert len(notes["calibration"]["files"]) == 2
    again = {r.name: r for r in run_pipeline(load_config(path), store, until="quantize", console=quiet)}
    assert again["quantize"].outcome == "cached"
    reseeded = {r.name: r for r in run_pipeline(load_config(path, ["quantize.calibration.seed=1"]), store, until="quantize", console=quiet)}
    assert reseeded["quantize"].outcome == "built"
    assert reseeded["quantize"].ref.manifest["notes"]["calibration"]["token_ids_sha256"] != notes["calibration"]["token_ids_sha256"]


@pytest.mark.slow
def test_llmapi_target_also_gets_the_unified_hf_checkpoint(tmp_path: Path) -> None:
    path = _config(tmp_path, FP8, target="llmapi")
    results = {r.name: r for r in run_pipeline(load_config(path), ArtifactStore(tmp_path / "artifacts", "q"), until="quantize", console=Console(quiet=True))}
    out = results["quantize"].ref.path
    assert (out / "trtllm_checkpoint" / "rank0.safetensors").is_file()
    hf = out / "hf_checkpoint"
    config = json.loads((hf / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt" and config["quantization_config"]["quant_algo"] == "FP8"
    assert json.loads((hf / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert (hf / "tokenizer.json").is_file() and list(hf.glob("*.safetensors"))

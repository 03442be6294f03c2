"""End-to-end runs of the pipeline on the embedded default model (no tritonserver): caching, invalidation,
failure atomicity, and the exported TensorRT-LLM checkpoint itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors import safe_open

from pipeline.artifacts import ArtifactStore
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.runner import run_pipeline
from tests.conftest import DEFAULT_MODEL, REPO

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, model: Path = DEFAULT_MODEL, name: str = "tiny") -> Path:
    text = (REPO / "build_configs" / "tiny-cpu.yaml").read_text()
    text = text.replace("name: tiny-cpu", f"name: {name}").replace("../models/tiny-stdlib-llama", str(model))
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _run(config: Path, artifacts: Path, *overrides: str, until: str | None = None, force: bool = False):
    loaded = load_config(config, overrides)
    store = ArtifactStore(artifacts, loaded.spec.name)
    results = run_pipeline(loaded, store, until=until, force=force, console=Console(quiet=True))
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("run")
    config = _config(root)
    artifacts = root / "artifacts"
    first = _run(config, artifacts)
    return config, artifacts, first


def test_first_run_builds_every_stage_then_everything_is_cached(built) -> None:
    config, artifacts, first = built
    assert [(name, r.outcome) for name, r in first.items()] == [
        ("prepare", "built"),
        ("quantize", "built"),
        ("build", "built"),
        ("package", "built"),
        ("deploy", "built"),
    ]
    second = _run(config, artifacts)
    assert all(r.outcome == "cached" for r in second.values())
    assert {n: r.ref.path for n, r in second.items()} == {n: r.ref.path for n, r in first.items()}


def test_changing_a_build_field_reruns_build_only(built) -> None:
    config, artifacts, first = built
    changed = _run(config, artifacts, "build.max_seq_len=900")
    assert [(n, r.outcome) for n, r in changed.items()] == [
        ("prepare", "cached"),
        ("quantize", "cached"),
        ("build", "built"),
        ("package", "built"),
        ("deploy", "built"),
    ]
    engine = json.loads((changed["build"].ref.path / "engine" / "config.json").read_text())
    assert engine["build_config"]["max_seq_len"] == 900
    assert changed["build"].ref.path != first["build"].ref.path


def test_manifest_records_inputs_tools_and_hashes(built) -> None:
    _, _, first = built
    manifest = first["quantize"].ref.manifest
    assert manifest["stage"] == "quantize" and manifest["upstream"] == {"prepare": first["prepare"].ref.digest}
    assert manifest["tools"]["modelopt"].startswith("0.4")
    assert set(manifest["files"]) == {"quantize.json", "trtllm_checkpoint/config.json", "trtllm_checkpoint/rank0.safetensors"}
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())


def test_checkpoint_config_and_tensor_names(built) -> None:
    _, _, first = built
    ckpt = first["quantize"].ref.path / "trtllm_checkpoint"
    config = json.loads((ckpt / "config.json").read_text())
    hf = json.loads((DEFAULT_MODEL / "config.json").read_text())
    assert config["architecture"] == "LlamaForCausalLM"
    assert config["dtype"] == "float16"
    for trt_key, hf_key in [
        ("vocab_size", "vocab_size"),
        ("hidden_size", "hidden_size"),
        ("num_hidden_layers", "num_hidden_layers"),
        ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"),
        ("intermediate_size", "intermediate_size"),
        ("max_position_embeddings", "max_position_embeddings"),
    ]:
        assert config[trt_key] == hf[hf_key], trt_key
    assert config["hidden_act"] == "silu" and config["position_embedding_type"] == "rope_gpt_neox"
    assert config["mapping"]["world_size"] == 1 and config["quantization"]["quant_algo"] is None
    with safe_open(ckpt / "rank0.safetensors", framework="pt") as handle:
        names = set(handle.keys())
    assert {"transformer.vocab_embedding.weight", "transformer.ln_f.weight", "lm_head.weight"} <= names
    for i in range(hf["num_hidden_layers"]):
        for suffix in ("input_layernorm", "post_layernorm", "attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
            assert f"transformer.layers.{i}.{suffix}.weight" in names


def test_checkpoint_reproduces_hf_logits(built) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from pipeline.quantization.trtllm_checkpoint.reverse import trtllm_to_hf_state_dict

    _, _, first = built
    _, state = trtllm_to_hf_state_dict(first["quantize"].ref.path / "trtllm_checkpoint")
    reference = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32)
    reloaded = LlamaForCausalLM(reference.config)
    missing, unexpected = reloaded.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    tokens = torch.randint(3, reference.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits.flatten()
        got = reloaded.float()(tokens).logits.flatten()
    cosine = torch.nn.functional.cosine_similarity(expected, got, dim=0).item()
    assert cosine >= 0.9999


def test_cpu_engine_directory_has_trtllm_engine_keys(built) -> None:
    _, _, first = built
    engine = first["build"].ref.path / "engine"
    config = json.loads((engine / "config.json").read_text())
    assert set(config) == {"version", "pretrained_config", "build_config"}
    assert config["build_config"]["plugin_config"]["tokens_per_block"] == 32
    assert config["build_config"]["max_batch_size"] == 32 and config["build_config"]["kv_cache_type"] == "PAGED"
    assert (engine / "rank0.safetensors").is_file()


def test_tp2_checkpoint_has_two_ranks_that_concatenate_back(built, tmp_path: Path) -> None:
    config, artifacts, first = built
    sharded = _run(config, artifacts, "build.tp_size=2", until="quantize")
    assert sharded["prepare"].outcome == "cached" and sharded["quantize"].outcome == "built"
    ckpt = sharded["quantize"].ref.path / "trtllm_checkpoint"
    assert json.loads((ckpt / "config.json").read_text())["mapping"]["tp_size"] == 2
    full = first["quantize"].ref.path / "trtllm_checkpoint" / "rank0.safetensors"
    with (
        safe_open(full, framework="pt") as f,
        safe_open(ckpt / "rank0.safetensors", framework="pt") as r0,
        safe_open(ckpt / "rank1.safetensors", framework="pt") as r1,
    ):
        dense = "transformer.layers.0.attention.dense.weight"  # row-parallel: split along the input dim
        assert torch.equal(torch.cat([r0.get_tensor(dense), r1.get_tensor(dense)], dim=1), f.get_tensor(dense))
        fc = "transformer.layers.0.mlp.fc.weight"  # column-parallel: split along the output dim
        assert torch.equal(torch.cat([r0.get_tensor(fc), r1.get_tensor(fc)], dim=0), f.get_tensor(fc))


def test_cpu_build_of_a_sharded_checkpoint_is_refused_before_running(built, capsys: pytest.CaptureFixture[str]) -> None:
    config, artifacts, _ = built
    before = sorted(p.name for p in (artifacts / "tiny").iterdir())
    assert main(["--artifacts", str(artifacts), "run", str(config), "--set", "build.tp_size=2"]) == 2
    assert "build.target cpu runs one rank" in capsys.readouterr().err
    assert sorted(p.name for p in (artifacts / "tiny").iterdir()) == before


def test_cpu_build_with_more_beams_than_batch_rows_is_refused_before_running(built, capsys: pytest.CaptureFixture[str]) -> None:
    config, artifacts, _ = built
    overrides = ["--set", "build.max_beam_width=8", "--set", "build.max_batch_size=4"]
    assert main(["--artifacts", str(artifacts), "run", str(config), *overrides]) == 2
    assert "build.max_beam_width 8 exceeds build.max_batch_size 4" in capsys.readouterr().err


def test_tampered_artifact_is_rebuilt(built) -> None:
    config, artifacts, first = built
    weights = first["build"].ref.path / "engine" / "config.json"
    original = weights.read_text()
    weights.write_text(original.replace('"max_batch_size": 32', '"max_batch_size": 31'))
    rerun = _run(config, artifacts)
    assert rerun["build"].outcome == "built" and "verification" in rerun["build"].note
    assert weights.read_text() == original


def test_cli_plan_json_reports_cache_hits(built, capsys: pytest.CaptureFixture[str]) -> None:
    config, artifacts, first = built
    assert main(["--artifacts", str(artifacts), "plan", str(config), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["cached"]) for s in plan["stages"]] == [("prepare", True), ("quantize", True), ("build", True), ("package", True), ("deploy", True)]
    assert plan["stages"][1]["digest"] == first["quantize"].ref.digest


def test_failed_stage_exits_1_and_keeps_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "no-tokenizer"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        os.link(DEFAULT_MODEL / name, model / name)
    config = _config(tmp_path, model=model, name="broken")
    artifacts = tmp_path / "artifacts"
    assert main(["--artifacts", str(artifacts), "run", str(config)]) == 1
    err = capsys.readouterr().err
    assert "has no tokenizer" in err and "hint:" in err
    assert [p.name for p in (artifacts / "broken").iterdir() if not p.name.startswith(".lock")] == []


def test_sigkill_mid_stage_leaves_no_artifact_and_next_run_redoes_it(tmp_path: Path) -> None:
    config = _config(tmp_path, name="killed")
    artifacts = tmp_path / "artifacts"
    command = [sys.executable, "-m", "pipeline", "--artifacts", str(artifacts), "run", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    build_dir = artifacts / "killed"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if build_dir.is_dir() and any(p.name.startswith(".tmp-quantize-") for p in build_dir.iterdir()):
                break
            if process.poll() is not None:
                pytest.fail("the run finished before it could be killed mid-stage")
            time.sleep(0.02)
        else:
            pytest.fail("the quantize stage never started")
        time.sleep(0.5)  # well inside ModelOpt's import
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    names = sorted(p.name for p in build_dir.iterdir())
    assert any(n.startswith("prepare-") for n in names)
    assert not any(n.startswith("quantize-") for n in names)
    rerun = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "removed an unfinished artifact" in rerun.stdout
    names = sorted(p.name for p in build_dir.iterdir())
    assert any(n.startswith("quantize-") for n in names) and not any(n.startswith(".tmp-") for n in names)


def test_generate_command_matches_transformers_greedy(built, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM

    config, artifacts, _ = built
    prompt = "import os\ndef "
    assert main(["--artifacts", str(artifacts), "generate", str(config), "--prompt", prompt, "--max-tokens", "24", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float16).float()
    with torch.no_grad():
        expected = model.generate(torch.tensor([result["prompt_token_ids"]]), max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=0)[
            0, len(result["prompt_token_ids"]) :
        ].tolist()
    assert result["output_token_ids"] == expected[: len(result["output_token_ids"])]
    assert len(result["output_token_ids"]) == 24 or result["finish_reason"] == "stop"
    assert result["text"] and result["prompt"] == prompt


def test_generate_refuses_bad_request(built, capsys: pytest.CaptureFixture[str]) -> None:
    config, artifacts, _ = built
    assert main(["--artifacts", str(artifacts), "generate", str(config), "--prompt", "x", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_bench_engine_command_quick(built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, artifacts, _ = built
    out = tmp_path / "bench.json"
    assert main(["--artifacts", str(artifacts), "bench", "engine", str(config), "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"systems", "ratios", "kv_utilisation", "prefix_reuse"} <= set(result)
    assert "(a) refengine, inflight batching" in capsys.readouterr().out

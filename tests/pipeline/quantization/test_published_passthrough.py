"""A published ModelOpt checkpoint served as published (issue #46): the project's own FP8 + FP8 KV quantize path
(ModelOpt calibration, the unified export kept, then the converter) gives a unified checkpoint exactly like
`nvidia/...-FP8`; given as model.source with quantize.algo none, the cpu pipeline converts it as it is (no model
load, no calibration) into the same TensorRT-LLM checkpoint, tensor for tensor, and refengine's greedy tokens on it
are those of the project's own FP8 run. The old behaviour (FP8 codes cast to float16, scales dropped) cannot come back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.artifacts import CHECKPOINT_DIR
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.errors import SpecError, StageError
from tests.conftest import DEFAULT_MODEL
from tests.support import prequantized_fixtures as fx
from tests.support.published_checkpoint import own_fp8_export, published_config, run_until

pytestmark = pytest.mark.slow
PROMPTS = ([1, 17, 42, 99, 5, 230], [1, 64, 3, 3, 8])


@pytest.fixture(scope="module")
def own_fp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return own_fp8_export(tmp_path_factory.mktemp("own-fp8"))


@pytest.fixture(scope="module")
def served(own_fp8, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quantize artifact of `run --until build` on the published checkpoint (cpu target, algo none)."""
    root = tmp_path_factory.mktemp("served")
    results = run_until(published_config(root, own_fp8[1]), root / "artifacts", "build")
    assert [r.outcome for r in results.values()] == ["built", "built", "built"]
    return results["quantize"].ref.path


def test_validate_accepts_it_and_says_it_is_served_as_published(own_fp8, tmp_path: Path, capsys) -> None:
    assert main(["--artifacts", str(tmp_path / "a"), "validate", str(published_config(tmp_path, own_fp8[1]))]) == 0
    out = capsys.readouterr().out
    assert "weights: pre-quantized, ModelOpt FP8 (per-tensor scales)" in out and "KV cache FP8" in out
    assert "served as published, no calibration on build.target cpu" in out


def test_the_written_checkpoint_equals_the_projects_own_fp8_conversion_tensor_for_tensor(own_fp8, served: Path) -> None:
    own, published = (load_file(d / "rank0.safetensors") for d in (own_fp8[0], served / CHECKPOINT_DIR))
    assert sorted(published) == sorted(own)
    for name, tensor in own.items():
        assert published[name].dtype == tensor.dtype, name
        assert torch.equal(published[name].view(torch.uint8), tensor.view(torch.uint8)), name
    configs = [json.loads((d / "config.json").read_text()) for d in (own_fp8[0], served / CHECKPOINT_DIR)]
    assert configs[1] == configs[0]


def test_the_old_float16_cast_of_fp8_codes_cannot_come_back(served: Path) -> None:
    """Before: quant_algo None and every weight float16 (the codes cast, the scales dropped)."""
    config = json.loads((served / CHECKPOINT_DIR / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == "FP8" and config["quantization"]["kv_cache_quant_algo"] == "FP8"
    tensors = load_file(served / CHECKPOINT_DIR / "rank0.safetensors")
    assert tensors["transformer.layers.0.mlp.proj.weight"].dtype == torch.float8_e4m3fn
    assert "transformer.layers.0.mlp.proj.weights_scaling_factor" in tensors


def test_the_quantize_record_names_the_published_format_and_scales_and_no_calibration(own_fp8, served: Path) -> None:
    record = json.loads((served / "quantize.json").read_text())
    assert "calibration" not in record
    assert record["quantization"]["quant_algo"] == "FP8"
    published = record["published"]
    assert published["hf_quant_config"]["quant_algo"] == "FP8" and published["hf_quant_config"]["kv_cache_quant_algo"] == "FP8"
    layers = json.loads((own_fp8[1] / "config.json").read_text())["num_hidden_layers"]
    assert published["scales"]["weight_scale"]["tensors"] == 7 * layers  # q, k, v, o, gate, up, down
    assert published["scales"]["k_scale"]["tensors"] == layers
    assert 0 < published["scales"]["weight_scale"]["min"] <= published["scales"]["weight_scale"]["max"]


def test_refengine_greedy_tokens_equal_those_of_the_projects_own_fp8run_until(own_fp8, served: Path) -> None:
    from refengine import EngineConfig, LLMEngine, SamplingParams

    config = EngineConfig(tokens_per_block=4, max_seq_len=64, max_input_len=16)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    tokens = []
    for checkpoint in (own_fp8[0], served / CHECKPOINT_DIR):
        outputs = LLMEngine.from_checkpoint(checkpoint, config).generate([list(p) for p in PROMPTS], params)
        tokens.append([list(o.outputs[0].token_ids) for o in outputs])
    assert tokens[1] == tokens[0] and all(len(t) == 12 for t in tokens[0])


def test_quantizing_the_published_checkpoint_again_is_refused(own_fp8, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_config(published_config(tmp_path, own_fp8[1], algo="fp8", kv="fp8"))
    assert "quantize.algo fp8 / quantize.kv_cache fp8 on a pre-quantized checkpoint (ModelOpt FP8" in info.value.message
    assert "would re-quantize quantized codes" in info.value.message


def test_the_stage_refuses_a_declared_format_it_does_not_serve_even_past_validate(tmp_path: Path) -> None:
    """The quantize stage's own guard: a checkpoint declaring NVFP4 is never read as plain weights on cpu."""
    from pipeline.quantization.dispatch import request_from_spec

    source = fx.tiny_qwen2(tmp_path / "base")
    (source / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}))
    spec = load_config(published_config(tmp_path, DEFAULT_MODEL)).spec
    with pytest.raises(StageError) as info:
        request_from_spec(spec, source, tmp_path / "artifact", result_file=False)
    assert "ModelOpt NVFP4 is not served as published on build.target cpu" in info.value.message
    assert str(source / "hf_quant_config.json") in info.value.message

"""Pre-quantized checkpoints at `validate`: each format detected from its files, served as published where the table
says (ModelOpt FP8 / INT4 AWQ / W4A8 AWQ on cpu and engine), refused on every other build.target with what would
work, and the bad inputs (contradicting declarations, missing or misshapen scales, NaN / zero scales) refused naming
the file and tensor. Fixtures: tests/support/prequantized_fixtures.py (ModelOpt's formats written by ModelOpt, the
others from their published layouts)."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.config.prequantized import _MODELOPT_ALGOS
from pipeline.config.prequantized_targets import FORMATS, answer_for, inspect_quantization
from pipeline.errors import SpecError
from tests.conftest import REPO
from tests.support import prequantized_fixtures as fx

TARGETS = ("cpu", "engine", "llmapi")
# the cells validate accepts with quantize.algo none: ModelOpt unified formats the project's converter writes a
# TensorRT-LLM checkpoint from, on the targets that run that checkpoint; every other cell is refused
SERVED = {(name, target) for name in ("modelopt_fp8", "modelopt_int4_awq", "modelopt_w4a8_awq") for target in ("cpu", "engine")}
# fixture -> (format id, words of its label, group size, block, KV cache)
EXPECTED = {
    "modelopt_fp8": ("modelopt_fp8", "ModelOpt FP8", None, None, "FP8"),
    "modelopt_int4_awq": ("modelopt_int4_awq", "INT4 AWQ", 64, None, None),
    "modelopt_w4a8_awq": ("modelopt_w4a8_awq", "W4A8 AWQ", 64, None, None),
    "modelopt_nvfp4": ("modelopt_nvfp4", "NVFP4", 16, None, None),
    "ct_fp8": ("ct_fp8", "compressed-tensors FP8", None, None, None),
    "ct_w4a16": ("ct_w4a16", "compressed-tensors INT4 weight-only", 32, None, None),
    "autoawq": ("awq_int4", "AutoAWQ INT4", 32, None, None),
    "gptq": ("gptq_int4", "GPTQ INT4", 32, None, None),
    "deepseek_fp8": ("fp8_block", "FP8 block scales", None, (64, 64), None),
    "mxfp4": ("mxfp4", "MXFP4", 32, None, None),
}
CELLS = [(name, target) for name in EXPECTED for target in TARGETS]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prequantized")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = fx.tiny_qwen2(root / "base")
        made = {"base": base, "modelopt_fp8": fx.modelopt_export(base, "fp8", root / "modelopt_fp8", kv_cache="fp8")}
        for algo in ("int4_awq", "w4a8_awq", "nvfp4"):
            made[f"modelopt_{algo}"] = fx.modelopt_export(base, algo, root / f"modelopt_{algo}")
    finally:
        torch.set_num_threads(previous)
    specs = {
        "ct_fp8": (fx.CT_FP8, fx.fp8_per_tensor),
        "ct_w4a16": (fx.CT_W4A16, fx.w4a16_packed(32)),
        "autoawq": (fx.AWQ, fx.autoawq(32)),
        "gptq": (fx.GPTQ, fx.gptq(32)),
        "deepseek_fp8": (fx.DEEPSEEK_FP8, fx.fp8_block(64)),
        "mxfp4": (fx.MXFP4, fx.mxfp4),
    }
    for name, (quantization_config, layer) in specs.items():
        made[name] = fx.from_spec(base, root / name, quantization_config, layer)
    return made


def write_config(tmp_path: Path, source: Path, target: str = "cpu", algo: str = "none") -> Path:
    path = tmp_path / f"{target}-{algo}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: prequantized
            model:
              source: {source}
              dtype: float16
            quantize:
              algo: {algo}
              kv_cache: none
              calibration: {{files: ["{REPO}/data/calibration/*.txt"]}}
            build:
              target: {target}
              max_input_len: 128
              max_seq_len: 256
            """
        )
    )
    return path


def refusal(tmp_path: Path, source: Path, target: str = "cpu", algo: str = "none") -> str:
    with pytest.raises(SpecError) as info:
        load_config(write_config(tmp_path, source, target, algo))
    return info.value.message


def test_the_modelopt_fp8_export_with_algo_none_is_served_as_published_on_cpu_and_engine(checkpoints, tmp_path: Path, capsys) -> None:
    """The issue's case: the project's own FP8 unified export given as model.source validated and built garbage (FP8
    codes cast to float16). Now cpu and engine convert it as published; llmapi, which re-exports, refuses it."""
    source = checkpoints["modelopt_fp8"]
    for target in ("cpu", "engine"):
        assert main(["--artifacts", str(tmp_path / "a"), "validate", str(write_config(tmp_path, source, target))]) == 0
        out = capsys.readouterr().out
        assert f"from {source / 'hf_quant_config.json'}: quantization.quant_algo FP8" in out and "KV cache FP8" in out
        assert f"served as published, no calibration on build.target {target}" in out
    message = refusal(tmp_path, source, "llmapi")
    assert f"{source / 'hf_quant_config.json'}: quantization.quant_algo FP8" in message
    assert "build.target llmapi does not serve pre-quantized checkpoints" in message and "re-exports them through ModelOpt" in message
    assert "TensorRT-LLM 1.2's PyTorch backend loads it as published" in message
    assert "build.target engine and cpu serve it as published (quantize.algo none)" in message
    assert "quantize.algo fp8 and quantize.kv_cache fp8" in message


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_format_is_detected_from_its_files(name: str, checkpoints) -> None:
    fmt, words, group, block, kv = EXPECTED[name]
    found, tensors = inspect_quantization(_info(checkpoints[name]))
    assert found is not None
    assert (found.format, found.group_size, found.block_size, found.kv_cache) == (fmt, group, block, kv)
    assert words in found.label
    assert tensors  # headers read


@pytest.mark.parametrize("name, target", sorted(set(CELLS) - SERVED))
def test_every_other_format_and_target_is_refused_naming_what_would_work(name: str, target: str, checkpoints, tmp_path: Path) -> None:
    started = time.monotonic()
    message = refusal(tmp_path, checkpoints[name], target)
    assert time.monotonic() - started < 10
    fmt, words, *_ = EXPECTED[name]
    reads, same_algo = answer_for(inspect_quantization(_info(checkpoints[name]))[0])
    assert words in message and f"build.target {target} does not serve pre-quantized checkpoints" in message
    assert str(checkpoints[name]) in message and "What would work: " + reads in message
    if same_algo is not None:
        assert f"set quantize.algo {same_algo}" in message
    if target == "llmapi":
        assert "re-exports them through ModelOpt" in message
    if name in {served for served, _ in SERVED}:
        assert "build.target engine and cpu serve it as published (quantize.algo none)" in message
    else:
        assert "serve it as published" not in message


@pytest.mark.parametrize("name, target", sorted(SERVED))
def test_the_modelopt_formats_the_converter_takes_are_served_as_published(name: str, target: str, checkpoints, tmp_path: Path, capsys) -> None:
    started = time.monotonic()
    assert main(["--artifacts", str(tmp_path / "a"), "validate", str(write_config(tmp_path, checkpoints[name], target))]) == 0
    assert time.monotonic() - started < 10
    out = capsys.readouterr().out
    assert f"valid: {tmp_path / f'{target}-none.yaml'}" in out and EXPECTED[name][1] in out
    assert f"served as published, no calibration on build.target {target}" in out


def test_quantizing_a_prequantized_checkpoint_again_is_refused(checkpoints, tmp_path: Path) -> None:
    message = refusal(tmp_path, checkpoints["modelopt_fp8"], "engine", algo="fp8")
    assert "engine-fp8.yaml:6: quantize.algo fp8 / quantize.kv_cache none on a pre-quantized checkpoint (ModelOpt FP8" in message
    assert "would re-quantize quantized codes" in message


def test_an_unquantized_checkpoint_validates_and_validate_and_plan_say_so(checkpoints, tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, checkpoints["base"])
    assert main(["--artifacts", str(tmp_path / "a"), "validate", str(config)]) == 0
    assert main(["--artifacts", str(tmp_path / "a"), "plan", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("weights: not pre-quantized (") == 2 and "F16" in out


def test_gptq_act_order_and_symmetry_are_read(checkpoints, tmp_path: Path) -> None:
    source = fx.from_spec(checkpoints["base"], tmp_path / "gptq-act", {**fx.GPTQ, "desc_act": True, "sym": False}, fx.gptq(32, desc_act=True))
    found = inspect_quantization(_info(source))[0]
    assert found is not None and dict(found.details) == {"bits": "4", "desc_act": "true", "sym": "false"}
    assert "desc_act true" in refusal(tmp_path, source, "engine")


# -- bad inputs -------------------------------------------------------------------------------------------------------
def test_hf_quant_config_saying_fp8_over_float16_weights_is_refused(checkpoints, tmp_path: Path) -> None:
    source = _copy(checkpoints["base"], tmp_path / "says-fp8")
    (source / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}))
    message = refusal(tmp_path, source)
    assert f"{source / 'hf_quant_config.json'}: quantization.quant_algo FP8 declares ModelOpt FP8" in message
    assert "no tensor holds float8_e4m3fn (F8_E4M3) weights; e.g. model.layers.0." in message and "is F16" in message


def test_missing_scale_tensors_are_named(checkpoints, tmp_path: Path) -> None:
    skip = ("model.layers.1.mlp.down_proj.weight_scale", "model.layers.1.mlp.up_proj.weight_scale")
    source = fx.from_spec(checkpoints["base"], tmp_path / "no-scales", fx.CT_FP8, fx.fp8_per_tensor, skip=skip)
    message = refusal(tmp_path, source)
    assert "model.layers.1.mlp.down_proj.weight has no scale tensor model.layers.1.mlp.down_proj.weight_scale (and 1 more layers)" in message
    assert str(source / "model.safetensors") in message


def test_an_unknown_quant_method_is_refused_by_name(checkpoints, tmp_path: Path) -> None:
    source = _copy(checkpoints["base"], tmp_path / "unknown")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitnet", "bits": 2}
    (source / "config.json").write_text(json.dumps(config))
    message = refusal(tmp_path, source)
    assert f"{source / 'config.json'}: quantization_config.quant_method 'bitnet' is not a format this tool reads" in message


def test_block_scales_of_the_wrong_shape_are_refused(checkpoints, tmp_path: Path) -> None:
    source = fx.from_spec(checkpoints["base"], tmp_path / "wrong-blocks", fx.DEEPSEEK_FP8, fx.fp8_block(32))  # declares 64×64
    message = refusal(tmp_path, source, "llmapi")
    assert ".weight_scale_inv has shape [" in message and "needs [" in message and str(source / "model.safetensors") in message


def test_a_pickled_checkpoint_is_refused(checkpoints, tmp_path: Path) -> None:
    source = tmp_path / "pickled"
    source.mkdir()
    shutil.copy(checkpoints["modelopt_fp8"] / "config.json", source / "config.json")
    torch.save({"w": torch.zeros(1)}, source / "pytorch_model.bin")
    assert "holds only pickled weights (pytorch_model.bin)" in refusal(tmp_path, source)


@pytest.mark.parametrize("value, word", [(float("nan"), "NaN"), (0.0, "zero"), (float("inf"), "infinite")])
def test_nan_zero_and_infinite_scales_are_refused(value: float, word: str, checkpoints, tmp_path: Path) -> None:
    source = _copy(checkpoints["modelopt_fp8"], tmp_path / f"scale-{word}")
    tensors = load_file(source / "model.safetensors")
    tensors["model.layers.1.self_attn.o_proj.weight_scale"] = torch.tensor(value)
    save_file(tensors, str(source / "model.safetensors"))
    message = refusal(tmp_path, source)
    assert f"{source / 'model.safetensors'}: model.layers.1.self_attn.o_proj.weight_scale holds a {word} scale" in message


def test_quantized_tensors_without_a_declaration_are_refused(checkpoints, tmp_path: Path) -> None:
    source = _copy(checkpoints["modelopt_fp8"], tmp_path / "undeclared")
    (source / "hf_quant_config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    del config["quantization_config"]
    (source / "config.json").write_text(json.dumps(config))
    message = refusal(tmp_path, source)
    assert "is F8_E4M3, but neither config.json (quantization_config) nor hf_quant_config.json declares the format" in message


def test_every_detected_format_has_an_answer() -> None:
    ids = {fmt for fmt, _ in _MODELOPT_ALGOS.values()} | {fmt for fmt, *_ in EXPECTED.values()}
    assert ids - {"gptq_int4"} <= set(FORMATS)


def _info(path: Path):
    from pipeline.config.model_info import read_model_info

    return read_model_info(path)


def _copy(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def test_a_config_only_example_declaring_a_quantization_validates_and_says_what_follows(tmp_path: Path, capsys) -> None:
    """models/deepseek-v3 holds config.json only: nothing can be mis-read, and the weights line says what validate
    answers once the weights are there."""
    config = REPO / "build_configs" / "deepseek-v3-fp8-llmapi-tp8.yaml"
    assert main(["--artifacts", str(tmp_path), "validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert "(config.json only), which declares a pre-quantized checkpoint: FP8 block scales" in out
    assert "block 128×128" in out and "validate refuses it on every build.target" in out

"""The quantize job (`python3 -m pipeline.quantization.job --request …`): its request, its imports, its device check.

The job runs in this process, or in NVIDIA's TensorRT-LLM image for `quantize.device: cuda` with the docker
runner (tests/pipeline/quantization/test_quantize_runners.py, which also runs the job's main path here on the CPU). Calibrating
on cuda cannot run on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.errors import StageError
from pipeline.quantization.job import (
    REQUEST_FILE,
    RESULT_FILE,
    CalibrationRequest,
    QuantizeRequest,
)
from tests.conftest import REPO


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


# -- the request ----------------------------------------------------------------------------------------
def test_request_round_trips_through_json_and_a_file(tmp_path: Path) -> None:
    for request in (
        _request(tmp_path),
        _request(tmp_path, calibration=None, algo="int8_wo", kv_cache="none", unified_hf_dir=tmp_path / "hf", result_file=None),
        _request(tmp_path, unified_hf_dir=tmp_path / "hf", unified_only=True),
        _request(tmp_path, checkpoint_config={"architecture": "LlamaForCausalLM", "mapping": {"tp_size": 2}}),
    ):
        data = json.loads(json.dumps(request.to_json()))
        assert QuantizeRequest.from_json(data) == request
        path = tmp_path / REQUEST_FILE
        request.write(path)
        assert QuantizeRequest.read(path) == request
    data = _request(tmp_path).to_json()
    assert data["format"] == "trtllm-pipeline quantize request 1"
    assert data["calibration"]["files"] == [str(tmp_path / "calib" / "a.txt"), str(tmp_path / "calib" / "b.jsonl")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "something else"}, "format is 'something else'"),
        ({"hf_dir": "relative/dir"}, "hf_dir: expected an absolute path, got 'relative/dir'"),
        ({"device": "tpu"}, "device 'tpu' is not one of cpu, cuda"),
        ({"tp_size": "2"}, "tp_size: expected int, got '2'"),
        ({"extra": 1}, "unknown fields ['extra']"),
        ({"calibration": {"files": []}}, "calibration: expected an object with files, num_samples"),
        ({"unified_only": True}, "unified_only is true but unified_hf_dir is not set"),
        ({"checkpoint_config": ["LlamaForCausalLM"]}, "checkpoint_config: expected dict"),
    ],
)
def test_bad_requests_name_the_field(tmp_path: Path, change: dict, message: str) -> None:
    data = {**_request(tmp_path).to_json(), **change}
    with pytest.raises(StageError) as info:
        QuantizeRequest.from_json(data, source="req.json")
    assert message in info.value.message and info.value.message.startswith("req.json")


# -- the device and the imports --------------------------------------------------------------------------
def test_the_export_refuses_cuda_without_a_cuda_device() -> None:
    """The in-process path names quantize.device too, e.g. for the cpu target with quantize.device cuda."""
    import torch

    from pipeline.quantization.modelopt_export import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(StageError, match=r"quantize.device is cuda, but torch .* sees no CUDA device here"):
        resolve_device("cuda")
    assert str(resolve_device("cpu")) == "cpu"


def test_the_job_imports_only_what_nvidias_image_has() -> None:
    code = textwrap.dedent("""
        import json, sys
        import pipeline.quantization.job, pipeline.calibration, pipeline.quantization.modelopt_export
        ours = sorted(m for m in sys.modules if m == "pipeline" or m.startswith("pipeline."))
        print(json.dumps({"ours": ours, "others": sorted(m for m in ("pydantic", "yaml", "rich", "ruamel") if m in sys.modules)}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=REPO)
    seen = json.loads(done.stdout)
    assert seen["others"] == []
    assert seen["ours"] == [
        "pipeline",
        "pipeline.calibration",
        "pipeline.errors",
        "pipeline.quant_formats",  # the format registry: standard library only
        "pipeline.quantization",
        "pipeline.quantization.job",
        "pipeline.quantization.modelopt_export",
        "pipeline.quantization.trtllm_checkpoint",
        "pipeline.quantization.trtllm_checkpoint.convert",
        "pipeline.quantization.trtllm_checkpoint.layout",
        "pipeline.quantization.trtllm_checkpoint.linear",
        "pipeline.quantization.trtllm_checkpoint.moe",
        "pipeline.quantization.trtllm_checkpoint.reverse",
        "pipeline.quantization.unified_export",
    ]
    # not pipeline.config (the family table reads refengine's, which NVIDIA's image does not have): the request
    # carries the checkpoint config instead


def test_quant_configs_of_the_older_modelopt_in_nvidias_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT-LLM 1.1/1.2 images pin ModelOpt ~=0.37, whose quant_cfg is a dict (pattern -> quantizer) and which
    has no update_quant_cfg_with_kv_cache_quant; the recipe is written into that shape (INT4_AWQ_CFG as 0.37 has it)."""
    import modelopt.torch.quantization as mtq

    from pipeline.quantization.modelopt_export import QuantRecipe, _mtq_config

    legacy_awq = {
        "quant_cfg": {
            "*weight_quantizer": {"num_bits": 4, "block_sizes": {-1: 128, "type": "static"}, "enable": True},
            "*input_quantizer": {"enable": False},
            "*lm_head*": {"enable": False},
            "default": {"enable": False},
        },
        "algorithm": {"method": "awq_lite", "alpha_step": 0.1},
    }
    monkeypatch.setattr(mtq, "INT4_AWQ_CFG", legacy_awq)
    monkeypatch.delattr(mtq, "update_quant_cfg_with_kv_cache_quant")
    config = _mtq_config(QuantRecipe("int4_awq", "fp8", 64))
    assert config["quant_cfg"]["*weight_quantizer"]["block_sizes"] == {-1: 64, "type": "static"}
    assert config["quant_cfg"]["*[kv]_bmm_quantizer"] == {"num_bits": (4, 3), "axis": None, "enable": True}
    assert config["algorithm"] == {"method": "awq_lite", "alpha_step": 0.1} and legacy_awq["quant_cfg"]["*weight_quantizer"]["block_sizes"][-1] == 128
    kv_only = _mtq_config(QuantRecipe("int8_wo", "int8"))
    assert kv_only == {"quant_cfg": {"default": {"enable": False}, "*[kv]_bmm_quantizer": {"num_bits": 8, "axis": None, "enable": True}}, "algorithm": "max"}

"""The quantization-format registry (pipeline/quant_formats.py) against the YAML vocabulary, TensorRT-LLM's and
ModelOpt's facts (the sources are named in that module and next to each table below), what the exporters and
refengine do, and the one paged-context-FMHA rule as every target applies it."""

from __future__ import annotations

import ast
import dataclasses
import itertools

import pytest

from pipeline import quant_formats
from pipeline.backends.cpu.target import cpu_build_config
from pipeline.backends.engine.build_rules import resolve
from pipeline.backends.engine.spec_request import request_from_spec
from pipeline.config.loader import load_config
from pipeline.config.spec import KVCacheQuant, QuantAlgo, Target
from pipeline.errors import SpecError, StageError
from pipeline.quant_formats import (
    KV_CACHE_FORMATS,
    WEIGHT_FORMATS,
    algos_where,
    kv_cache_format,
    kv_cache_format_named,
    paged_context_fmha_loss,
    weight_format,
    weight_format_named,
)
from pipeline.render.consistency import check_consistency
from tests.conftest import BUILD_CONFIGS, REPO

# NVIDIA/TensorRT-LLM tensorrt_llm/quantization/mode.py: the QuantAlgo enum of TensorRT-LLM 1.2 (KV_CACHE_QUANT_ALGO_LIST = FP8, INT8, NVFP4).
TRTLLM_QUANT_ALGOS = {
    "W8A16",
    "W4A16",
    "W4A16_AWQ",
    "W4A8_AWQ",
    "W8A16_GPTQ",
    "W4A16_GPTQ",
    "W8A8_SQ_PER_CHANNEL",
    "W8A8_SQ_PER_TENSOR_PLUGIN",
    "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
    "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
    "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
    "W4A8_QSERVE_PER_GROUP",
    "W4A8_QSERVE_PER_CHANNEL",
    "FP8",
    "FP8_PER_CHANNEL_PER_TOKEN",
    "FP8_BLOCK_SCALES",
    "MIXED_PRECISION",
    "NVFP4",
    "W4A8_NVFP4_FP8",
    "W4A8_MXFP4_FP8",
    "W4A8_MXFP4_MXFP8",
    "W4A16_MXFP4",
}
TRTLLM_KV_QUANT_ALGOS = {"FP8", "INT8", "NVFP4"}

# What the checkpoint's config.json says for each format, as modelopt_export and trtllm_build wrote it before the
# registry (ModelOpt 0.47's quantization blocks; int8_wo -> W8A16 as TensorRT-LLM's examples/quantization/quantize.py patches it).
CHECKPOINT_QUANT_ALGO = {
    "none": None,
    "fp8": "FP8",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "int8_wo": "W8A16",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "nvfp4": "NVFP4",
}
CHECKPOINT_KV_QUANT_ALGO = {"none": None, "fp8": "FP8", "int8": "INT8"}
# TensorRT-LLM's examples/quantization/quantize.py and ModelOpt 0.47's config names: quantize.py's --qformat -> ModelOpt config (int8_wo and none: no PTQ).
MODELOPT_CONFIGS = {
    "none": None,
    "fp8": "FP8_DEFAULT_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "int8_wo": None,
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}


# -- one record per YAML choice -----------------------------------------------------------------------------------
def test_every_yaml_choice_has_exactly_one_record():
    assert list(WEIGHT_FORMATS) == [a.value for a in QuantAlgo]
    assert list(KV_CACHE_FORMATS) == [k.value for k in KVCacheQuant]
    assert quant_formats.TARGETS == tuple(t.value for t in Target)
    assert all(weight_format(a).name == a.value for a in QuantAlgo) and all(kv_cache_format(k).name == k.value for k in KVCacheQuant)


def test_records_are_frozen_and_refuse_only_known_targets():
    for record in (*WEIGHT_FORMATS.values(), *KV_CACHE_FORMATS.values()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.name = "other"  # type: ignore[misc]
        with pytest.raises(TypeError):
            record.refused_targets["engine"] = "x"  # type: ignore[index]
        assert set(record.refused_targets) <= set(quant_formats.TARGETS) and record.runs_on(Target.engine)


def test_the_registry_imports_only_the_standard_library():
    tree = ast.parse((REPO / "pipeline" / "quant_formats.py").read_text(encoding="utf-8"))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules <= {"__future__", "collections.abc", "dataclasses", "types", "typing"}


# -- the records against the reference --------------------------------------------------------------------------
def test_checkpoint_names_are_what_the_exporters_write():
    assert {a: f.trtllm_quant_algo for a, f in WEIGHT_FORMATS.items()} == CHECKPOINT_QUANT_ALGO
    assert {k: f.trtllm_kv_quant_algo for k, f in KV_CACHE_FORMATS.items()} == CHECKPOINT_KV_QUANT_ALGO
    assert set(CHECKPOINT_QUANT_ALGO.values()) - {None} <= TRTLLM_QUANT_ALGOS
    assert set(CHECKPOINT_KV_QUANT_ALGO.values()) - {None} <= TRTLLM_KV_QUANT_ALGOS
    for name in CHECKPOINT_QUANT_ALGO.values():
        assert weight_format_named(name).trtllm_quant_algo == name
    assert weight_format_named("MIXED_PRECISION") is None and kv_cache_format_named("int8").name == "int8"


def test_modelopt_recipes_and_calibration():
    assert {a: f.modelopt_config for a, f in WEIGHT_FORMATS.items()} == MODELOPT_CONFIGS
    assert algos_where(lambda f: not f.calibrated) == ["none", "int8_wo"]  # CalibrationSpec.files: "every algo except none and int8_wo"
    assert algos_where(lambda f: f.group_wise) == ["int4_awq", "w4a8_awq"]  # block_sizes[-1] = group_size, pre_quant_scale
    assert {k: f.modelopt_num_bits for k, f in KV_CACHE_FORMATS.items()} == {"none": None, "fp8": (4, 3), "int8": 8}
    for algo, kv in itertools.product(QuantAlgo, KVCacheQuant):
        expected = algo.value not in ("none", "int8_wo") or kv is not KVCacheQuant.none
        assert quant_formats.needs_calibration(weight_format(algo), kv_cache_format(kv)) is expected, (algo, kv)


def test_modelopt_has_every_recipe():
    mtq = pytest.importorskip("modelopt.torch.quantization")
    for name in filter(None, MODELOPT_CONFIGS.values()):
        assert isinstance(getattr(mtq, name), dict), name


def test_build_features_each_format_excludes():
    assert algos_where(lambda f: f.fp8_context_fmha) == ["fp8", "w4a8_awq", "nvfp4"]  # builder.py: use_fp8_context_fmha
    assert algos_where(lambda f: f.fused_mlp) == ["none", "fp8"]  # builder.py: use_fused_mlp
    assert algos_where(lambda f: f.blackwell_rejected) == ["int8_sq", "int8_wo", "int4_awq"]  # builder.py: SM100-119
    assert [k for k, f in KV_CACHE_FORMATS.items() if f.blackwell_rejected] == ["int8"]
    assert {a: f.lora_rejected_by for a, f in WEIGHT_FORMATS.items() if f.lora_rejected_by} == {"int8_sq": "SmoothQuantLinear", "nvfp4": "FP4Linear"}
    assert algos_where(lambda f: f.lookahead_documented) == ["none", "fp8"]  # examples/lookahead: FP16 / BF16 / FP8
    assert {a: f.gemm_plugin for a, f in WEIGHT_FORMATS.items() if f.gemm_plugin} == {"fp8": "fp8", "nvfp4": "nvfp4"}
    assert algos_where(lambda f: f.gemm_plugin_auto) == ["nvfp4"]  # build.py: NVFP4 auto-enables gemm_plugin nvfp4
    assert algos_where(lambda f: f.fp8_qdq) == ["fp8"] and [k for k, f in KV_CACHE_FORMATS.items() if f.fp8] == ["fp8"]


def test_gpus_that_run_each_format():
    assert {a: f.min_sm for a, f in WEIGHT_FORMATS.items() if f.min_sm} == {"fp8": 89, "w4a8_awq": 89, "nvfp4": 100}
    assert {k: f.min_sm for k, f in KV_CACHE_FORMATS.items() if f.min_sm} == {"fp8": 89}
    assert quant_formats.sm_needed(weight_format("nvfp4"), kv_cache_format("fp8")) == 100
    assert quant_formats.sm_needed(weight_format("int8_sq"), kv_cache_format("int8")) is None
    assert 100 in quant_formats.BLACKWELL_SMS and 119 in quant_formats.BLACKWELL_SMS and 120 not in quant_formats.BLACKWELL_SMS


def test_targets_that_run_each_format():
    # "engine path is legacy": the PyTorch backend (llmapi) has no INT8 SmoothQuant, INT8 weight-only or INT8 KV cache;
    # NVFP4 needs a Blackwell GPU, so not the cpu reference engine.
    refused = {(name, target) for name, f in [*WEIGHT_FORMATS.items(), *KV_CACHE_FORMATS.items()] for target in f.refused_targets}
    assert refused == {("int8_sq", "llmapi"), ("int8_wo", "llmapi"), ("int8", "llmapi"), ("nvfp4", "cpu")}


def test_the_cpu_target_runs_what_refengine_loads():
    from refengine.model_runner.kv_quant import SUPPORTED_KV_CACHE_QUANT_ALGOS
    from refengine.model_runner.quantized_linear import SUPPORTED_QUANT_ALGOS

    for f in WEIGHT_FORMATS.values():
        assert f.runs_on("cpu") == (f.trtllm_quant_algo is None or f.trtllm_quant_algo in SUPPORTED_QUANT_ALGOS), f.name
    for k in KV_CACHE_FORMATS.values():
        assert k.runs_on("cpu") == (k.trtllm_kv_quant_algo is None or k.trtllm_kv_quant_algo in SUPPORTED_KV_CACHE_QUANT_ALGOS), k.name


def test_bytes_per_weight_and_per_kv_element():
    # 16-bit 2 B, FP8 1 B, INT4-AWQ at group 128 with FP16 scales 0.516 B.
    assert weight_format("none").bytes_per_param() == 2.0 and weight_format("fp8").bytes_per_param() == 1.0
    assert round(weight_format("int4_awq").bytes_per_param(128), 3) == 0.516
    assert weight_format("int4_awq").bytes_per_param(64) > weight_format("int4_awq").bytes_per_param(128)
    assert weight_format("nvfp4").bytes_per_param() == 0.5 + 1 / 16  # FP4 codes + an FP8 scale per 16 weights
    assert {k: f.bytes_per_element for k, f in KV_CACHE_FORMATS.items()} == {"none": 2.0, "fp8": 1.0, "int8": 1.0}


# -- the paged-context-FMHA rule (builder.py) -------------------------------------------------------------------
@pytest.mark.parametrize(
    "algo, kv, sm, expected",
    [
        ("none", "none", None, None),
        ("int8_sq", "int8", None, "kv_cache"),  # INT8 KV cache => paged context FMHA forced off
        ("fp8", "int8", 90, "kv_cache"),
        ("fp8", "fp8", None, None),  # FP8 KV keeps it as FP8 paged context FMHA with FP8-family weights
        ("w4a8_awq", "fp8", 90, None),
        ("nvfp4", "fp8", 100, None),
        ("int8_sq", "fp8", None, "weights"),  # quant_algo not in {FP8, W4A8_AWQ, NVFP4} with FP8 KV => off
        ("none", "fp8", 90, "weights"),
        ("int4_awq", "fp8", None, "weights"),
        ("fp8", "fp8", 80, "gpu"),  # SM < 89 => FP8 context FMHA off, and paged context FMHA with it under FP8 KV
        ("int4_awq", "none", 80, None),
    ],
)
def test_paged_context_fmha_loss(algo, kv, sm, expected):
    assert paged_context_fmha_loss(weight_format(algo), kv_cache_format(kv), sm) == expected


def _spec(algo: str, kv: str, target: str, *overrides: str):
    target_overrides = ("build.target=engine", "build.runner=dry-run") if target == "engine" else ()
    return load_config(BUILD_CONFIGS / "tiny-cpu-fp8.yaml", (f"quantize.algo={algo}", f"quantize.kv_cache={kv}", *target_overrides, *overrides))


@pytest.mark.parametrize(
    "algo, kv",
    [(a.value, k.value) for a, k in itertools.product(QuantAlgo, KVCacheQuant) if weight_format(a).runs_on("cpu") and kv_cache_format(k).runs_on("cpu")],
)
def test_cpu_and_engine_targets_apply_the_same_rule(algo, kv):
    """A format pair that loses paged context FMHA refuses KV reuse on both targets, and both engine configs record it off."""
    loses = paged_context_fmha_loss(weight_format(algo), kv_cache_format(kv)) is not None
    for target in ("cpu", "engine"):
        if loses:
            with pytest.raises(SpecError, match="serve.enable_kv_cache_reuse: true is not possible with quantize.kv_cache"):
                _spec(algo, kv, target)
        else:
            _spec(algo, kv, target)
    no_serve = ("serve.enable_kv_cache_reuse=false", "serve.enable_chunked_context=false")
    cpu, engine = _spec(algo, kv, "cpu", *no_serve), _spec(algo, kv, "engine", *no_serve)
    recorded = cpu_build_config(cpu.spec.build, max_seq_len=1024, dtype="float16", quantize=cpu.spec.quantize)
    settings, _ = resolve(request_from_spec(engine.spec, engine.model), None)
    assert recorded["plugin_config"]["use_paged_context_fmha"] is settings.use_paged_context_fmha is not loses


def test_llmapi_has_no_trtllm_build_rule():
    """The PyTorch backend builds no engine: FP8 KV with INT4 weights keeps KV reuse, and INT8 KV is refused for what it is."""
    load_config(BUILD_CONFIGS / "tiny-cpu-fp8.yaml", ("quantize.algo=int4_awq", "build.target=llmapi"))  # FP8 KV, reuse on
    with pytest.raises(SpecError, match="quantize.kv_cache int8 does not run on build.target llmapi"):
        load_config(BUILD_CONFIGS / "tiny-cpu-fp8.yaml", ("quantize.kv_cache=int8", "build.target=llmapi"))


def _engine_config(quant_algo: str | None, kv: str | None) -> dict:
    from tests.pipeline.render.test_render import tiny_engine_config

    config = tiny_engine_config()
    config["pretrained_config"]["quantization"] = {"quant_algo": quant_algo, "kv_cache_quant_algo": kv}
    return config


def test_the_package_check_reads_the_same_rule():
    spec = load_config(BUILD_CONFIGS / "tiny-cpu.yaml").spec
    with pytest.raises(StageError, match="kv_cache_quant_algo FP8 with quantization.quant_algo W8A8_SQ_PER_CHANNEL, which turns"):
        check_consistency(_engine_config("W8A8_SQ_PER_CHANNEL", "FP8"), spec.serve, "cpu", 4096)
    check_consistency(_engine_config("FP8", "FP8"), spec.serve, "cpu", 4096)

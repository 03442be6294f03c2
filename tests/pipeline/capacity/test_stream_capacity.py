"""The planner's streamed tokens/s (a roofline) and the Python-model instances sized
from it (issue #34): hand computations, the published anchor, and the counts the package stage renders."""

from __future__ import annotations

import math

import pytest

from pipeline.capacity.for_spec import planned_python_instances
from pipeline.capacity.planner import CapacityRequest, plan_capacity
from pipeline.capacity.streams import BATCHED_POSTPROCESSING, MEASURED, python_instances, token_roofline
from pipeline.config.loader import load_config
from pipeline.config.model_info import read_model_info
from tests.conftest import REPO

LLAMA_8B = read_model_info(REPO / "models" / "llama-3.1-8b-instruct")
EXAMPLE = REPO / "build_configs" / "llama-3.1-8b-fp8.yaml"
RATES = {rate.model: rate.per_instance for rate in MEASURED}


def _h200(max_batch_size):
    return plan_capacity(CapacityRequest(LLAMA_8B, quant_algo="fp8", kv_cache_dtype="fp8", gpu="H200", max_seq_len=8192, max_batch_size=max_batch_size))


def test_a_large_batch_is_bound_by_compute_as_the_references_ceiling_formula_says():
    plan = _h200(2048)
    roofline = token_roofline(plan)
    linear = plan.params.read_per_token + plan.params.embedding  # decoder + lm_head: the linear parameters, 7.5 B
    assert linear / 1e9 == pytest.approx(7.50, abs=0.01)
    assert roofline.bound == "compute" and roofline.batch == 2048
    # output tok/s ceiling = F · OSL / (2 · P_linear · (ISL + OSL)); 46.7 k at the measured 1,402 TFLOPS
    assert roofline.tokens_per_s == pytest.approx(1979e12 * 128 / (2 * linear * 256), rel=1e-9)
    assert roofline.tokens_per_s * 1402 / 1979 == pytest.approx(46_700, rel=0.01)
    # an upper bound of NVIDIA's published H200 figure (128/128, NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md at 00f37686)
    assert roofline.tokens_per_s >= 27_911


def test_the_examples_batch_of_64_is_bound_by_memory_bandwidth():
    plan = _h200(64)
    roofline = token_roofline(plan)
    kv_read = 64 * (128 + 64) * 64 * 1024  # B sequences × (ISL + OSL/2) tokens × 64 KiB of FP8 KV
    step = (plan.read_bytes_per_step + kv_read) / 4.8e12
    prefill = 2 * (plan.params.read_per_token + plan.params.embedding) * 128 / 1979e12
    assert roofline.bound == "memory bandwidth" and roofline.step_s == pytest.approx(step)
    assert roofline.tokens_per_s == pytest.approx(1 / (step / 64 + prefill / 128))
    assert 27_000 < roofline.tokens_per_s < 28_000


def test_instances_are_the_gpus_rate_over_one_instances_measured_rate():
    plans = {plan.model: plan for plan in python_instances(27_500.0)}
    assert plans["postprocessing"].instances == math.ceil(27_500 / RATES["postprocessing"])
    assert plans["bls"].instances == math.ceil(27_500 / RATES["bls"])
    assert plans["preprocessing"].instances == math.ceil(27_500 / 128 / RATES["preprocessing"])
    assert plans["postprocessing"].cores == pytest.approx(27_500 / RATES["postprocessing"])
    assert "BENCHMARKS.md" in plans["bls"].reasoning and "27,500 tokens/s" in plans["bls"].reasoning
    interval = {plan.model: plan for plan in python_instances(27_500.0, stream_interval=4)}
    assert interval["postprocessing"].needed == pytest.approx(27_500 / 4)  # a response carries 4 tokens
    batched = {plan.model: plan for plan in python_instances(27_500.0, batched_postprocessing=True)}
    assert batched["postprocessing"].per_instance == BATCHED_POSTPROCESSING.per_instance


def test_the_package_stage_plans_for_the_gpu_and_keeps_what_the_spec_sets():
    loaded = load_config(EXAMPLE)
    counts, reasoning = planned_python_instances(loaded.spec, loaded.model)
    rate = token_roofline(_h200(64)).tokens_per_s
    assert counts == {
        "preprocessing": math.ceil(rate / 128 / RATES["preprocessing"]),
        "postprocessing": math.ceil(rate / RATES["postprocessing"]),
        "bls": math.ceil(rate / RATES["bls"]),
    }
    assert any(line.startswith(f"serve.instances.bls: {counts['bls']} (") for line in reasoning)
    pinned = load_config(EXAMPLE, ["serve.instances.bls=2"])
    counts, reasoning = planned_python_instances(pinned.spec, pinned.model)
    assert counts["bls"] == 2 and "serve.instances.bls: 2 (set in the spec)" in reasoning


@pytest.mark.parametrize(
    "config, overrides, why",
    [
        ("tiny-cpu.yaml", [], "build.target cpu: its engine streams far below one instance's rate"),
        ("llama-3.1-8b-fp8.yaml", ["deploy.gpu=null"], "no deploy.gpu: the GPU's token rate is unknown"),
    ],
)
def test_without_a_gpus_rate_every_python_model_gets_one_instance(config, overrides, why):
    loaded = load_config(REPO / "build_configs" / config, overrides)
    counts, reasoning = planned_python_instances(loaded.spec, loaded.model)
    assert counts == {"preprocessing": 1, "postprocessing": 1, "bls": 1}
    assert all(why in line for line in reasoning)

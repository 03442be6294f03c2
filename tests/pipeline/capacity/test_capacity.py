"""Capacity planner vs hand computations with the planner's assumptions: H200 150.1 GB (torch total_memory),
4.8 TB/s (datasheet), a 5 GB reserve, KV fraction 0.9, embedding and lm_head 16-bit, INT4-AWQ 0.516 B/param."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.capacity.planner import (
    GB,
    CapacityError,
    CapacityRequest,
    capacity_table,
    count_params,
    kv_bytes_per_token,
    plan_capacity,
)
from pipeline.config.gpus import GPUS, get_gpu
from pipeline.config.model_info import read_model_info
from pipeline.errors import SpecError
from tests.conftest import REPO

LLAMA_8B = read_model_info(REPO / "models" / "llama-3.1-8b-instruct")
LLAMA_70B = read_model_info(REPO / "models" / "llama-3.3-70b-instruct")


def _h200(model, quant, kv="none", **kwargs):
    return plan_capacity(CapacityRequest(model, quant_algo=quant, kv_cache_dtype=kv, gpu="H200", max_seq_len=kwargs.pop("max_seq_len", 2048), **kwargs))


def test_parameter_counts():
    assert count_params(LLAMA_8B).total / 1e9 == pytest.approx(8.03, abs=0.005)
    assert count_params(LLAMA_70B).total / 1e9 == pytest.approx(70.55, abs=0.005)


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(LLAMA_8B, "none") == 128 * 1024 and kv_bytes_per_token(LLAMA_8B, "fp8") == 64 * 1024
    assert kv_bytes_per_token(LLAMA_70B, "bfloat16") == 320 * 1024 and kv_bytes_per_token(LLAMA_70B, "fp8") == 160 * 1024


# (model, quant) -> (weight GB, KV space GB, tokens BF16 KV, tokens FP8 KV, B=1 bound at 4.8 TB/s), computed by hand
REFERENCE = {
    ("8B", "none"): (16.1, 116, 886_000, 1_770_000, 320),
    ("8B", "fp8"): (9.1, 122, 934_000, 1_870_000, 598),
    ("8B", "int4_awq"): (5.7, 126, 957_000, 1_920_000, 1032),
    ("70B", "none"): (141.1, 3.6, 11_000, 22_000, 35),
    ("70B", "fp8"): (72.7, 65, 199_000, 398_000, 68),
    ("70B", "int4_awq"): (39.5, 95, 290_000, 580_000, 128),
}
MODELS = {"8B": LLAMA_8B, "70B": LLAMA_70B}


@pytest.mark.parametrize("key", REFERENCE, ids=lambda k: f"{k[0]}-{k[1]}")
def test_worked_numbers_for_one_h200(key):
    weights_gb, kv_gb, tokens_bf16, tokens_fp8, decode = REFERENCE[key]
    bf16_kv = _h200(MODELS[key[0]], key[1], "none")
    fp8_kv = _h200(MODELS[key[0]], key[1], "fp8")
    assert round(bf16_kv.weight_bytes / GB, 1) == weights_gb
    # KV space is printed to 0.1 GB below 10 GB, else to 1 GB (8B INT4: 0.9 × 139.4 = 125.46, printed as 126)
    assert bf16_kv.kv_space_bytes / GB == pytest.approx(kv_gb, abs=0.05 if kv_gb < 10 else 0.55)
    # the reference rounds token counts to 3 significant digits
    assert bf16_kv.kv_tokens == pytest.approx(tokens_bf16, rel=0.006)
    assert fp8_kv.kv_tokens == pytest.approx(tokens_fp8, rel=0.006)
    assert round(bf16_kv.decode_tokens_per_s_b1) == pytest.approx(decode, abs=1)


def test_decode_bound_at_measured_bandwidth():
    """The bound at the 4.2 TB/s an H200 was measured to read: 280 tok/s for 8B BF16, 523 for FP8."""
    for quant, expected in (("none", 280), ("fp8", 523)):
        plan = _h200(LLAMA_8B, quant)
        assert plan.decode_tokens_per_s_b1 * 4.197 / 4.8 == pytest.approx(expected, abs=2)


def test_concurrency_check_70b_fp8_at_1000_1000():
    """398 k tokens / 2,000 tokens per sequence ≈ 199 concurrent sequences (block rounding: 63 blocks each)."""
    plan = _h200(LLAMA_70B, "fp8", "fp8", max_seq_len=2000, max_batch_size=256)
    assert plan.kv_tokens // 2000 == 199
    assert plan.full_sequences == 197 and plan.recommended_max_batch_size == 197
    assert not plan.fits and any("only 197 full-length sequences fit" in n for n in plan.notes)


def test_70b_bf16_on_one_h200_fits_but_is_not_practical():
    plan = _h200(LLAMA_70B, "none", "none")
    assert plan.full_sequences == 5 and any("not practical" in n for n in plan.notes)


def test_70b_bf16_on_one_80gb_gpu_is_impossible():
    with pytest.raises(CapacityError, match=r"needs 141\.1 GB of weights per GPU .* H100-80GB has 85 GB: 61\.1 GB missing \(the weights fit with tp 2\)"):
        plan_capacity(CapacityRequest(LLAMA_70B, quant_algo="none", kv_cache_dtype="none", gpu="H100-80GB", max_seq_len=8192))


def test_kv_cache_smaller_than_one_sequence_is_impossible():
    # 70B BF16 on H200 leaves 3.6 GB of KV; one 131072-token BF16 sequence needs 42.9 GB
    with pytest.raises(CapacityError, match=r"one 131072-token sequence needs 42\.95 GB \(16-bit KV\): 43\.72 GB missing"):
        _h200(LLAMA_70B, "none", "none", max_seq_len=131072)


def test_tensor_parallel_splits_weights_and_kv_heads():
    one = plan_capacity(CapacityRequest(LLAMA_70B, quant_algo="fp8", kv_cache_dtype="fp8", gpu="H100-80GB", max_seq_len=16384, max_batch_size=64))
    two = plan_capacity(CapacityRequest(LLAMA_70B, quant_algo="fp8", kv_cache_dtype="fp8", gpu="H100-80GB", max_seq_len=16384, max_batch_size=64, tp=2))
    assert two.weight_bytes_per_gpu == pytest.approx(one.weight_bytes_per_gpu / 2)
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2 == 80 * 1024
    assert two.kv_tokens > 2 * one.kv_tokens


def test_recommendations_respect_the_request():
    plan = _h200(LLAMA_8B, "fp8", "fp8", max_seq_len=8192, max_batch_size=64)
    assert plan.fits and plan.recommended_max_batch_size == 64 and plan.recommended_max_num_tokens == 8192
    small = _h200(LLAMA_8B, "fp8", "fp8", max_seq_len=100, max_batch_size=1)
    assert small.recommended_max_num_tokens == 96  # one 100-token sequence, rounded down to whole 32-token blocks


def test_awq_group_size_changes_weight_bytes():
    g128 = _h200(LLAMA_8B, "int4_awq").weight_bytes
    g64 = _h200(LLAMA_8B, "int4_awq", group_size=64).weight_bytes
    assert g64 > g128


def test_gpu_table():
    assert set(GPUS) == {"H100-80GB", "H200", "L40S", "A100-80GB", "B200"}
    assert {name: g.compute_capability for name, g in GPUS.items()} == {"H100-80GB": 90, "H200": 90, "L40S": 89, "A100-80GB": 80, "B200": 100}
    assert get_gpu("h200").fp8_dense_tflops == 1979.0 and get_gpu("H200").bf16_dense_tflops == 989.0
    with pytest.raises(SpecError, match="unknown GPU 'V100'; known GPUs: H200, H100-80GB"):
        get_gpu("V100")


def test_fp8_on_a100_is_flagged():
    plan = plan_capacity(CapacityRequest(LLAMA_8B, quant_algo="fp8", kv_cache_dtype="none", gpu="A100-80GB", max_seq_len=8192))
    assert any("has no FP8" in n for n in plan.notes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tp": 3}, "tp 3 must be >= 1 and divide"),
        ({"kv_cache_free_gpu_mem_fraction": 0.0}, "kv_cache_free_gpu_mem_fraction must be in"),
        ({"quant_algo": "int2"}, "quantize.algo 'int2' is not one of"),
        ({"kv_cache_dtype": "fp4"}, "KV-cache dtype 'fp4' is not one of"),
    ],
)
def test_bad_inputs(kwargs, message):
    args = {"quant_algo": "fp8", "kv_cache_dtype": "fp8", "gpu": "H200", "max_seq_len": 4096, **kwargs}
    with pytest.raises(SpecError, match=message):
        plan_capacity(CapacityRequest(LLAMA_8B, **args))


def test_capacity_table_renders():
    out = io.StringIO()
    Console(file=out, width=120).print(capacity_table(_h200(LLAMA_70B, "fp8", "fp8", max_seq_len=2000, max_batch_size=256)))
    text = out.getvalue()
    assert "398,006" in text and "72.7 GB" in text and "160 KiB" in text and "does not fit" in text
    assert Path(LLAMA_70B.path).name in text


def test_every_yaml_quant_choice_has_a_weight_size():
    from pipeline.capacity.planner import weight_bytes_per_param
    from pipeline.config.spec import KVCacheQuant, QuantAlgo

    assert all(0 < weight_bytes_per_param(a.value) <= 2 for a in QuantAlgo)
    assert all(kv_bytes_per_token(LLAMA_8B, k.value) > 0 for k in KVCacheQuant)

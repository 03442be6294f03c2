"""The capacity planner per family, against hand computations from each model's config.json (models/*/config.json).

KV bytes per token: Σ over full-attention layers of kv_heads × 2 (K, V) × head_dim × bytes, where head_dim is the
config's own (Qwen3 and Gemma: not hidden ÷ heads); a sliding layer holds at most its window per sequence (Gemma 3,
GPT-OSS, where the target's runtime is given the window vector); MLA (DeepSeek) caches one latent of
kv_lora_rank + qk_rope_head_dim per layer, once (TensorRT-LLM's KV cache manager). MoE: every expert resident, a token reads k.
"""

from __future__ import annotations

import pytest

from pipeline.capacity.planner import GB, CapacityError, CapacityRequest, count_params, kv_bytes_per_sequence, kv_bytes_per_token, plan_capacity
from pipeline.config.families import family_of
from pipeline.config.model_info import read_model_info
from pipeline.config.targets import Target
from tests.conftest import REPO


def _model(name: str):
    return read_model_info(REPO / "models" / name)


QWEN3_8B, QWEN3_MOE, MIXTRAL = _model("qwen3-8b"), _model("qwen3-30b-a3b"), _model("mixtral-8x7b-instruct-v0.1")
GEMMA3_1B, PHI4, GPT_OSS, DEEPSEEK_V3 = _model("gemma-3-1b-it"), _model("phi-4"), _model("gpt-oss-20b"), _model("deepseek-v3")


def test_kv_bytes_use_the_configs_head_dim():
    assert QWEN3_8B.head_dim == 128 and QWEN3_8B.hidden_size // QWEN3_8B.num_heads == 128
    assert kv_bytes_per_token(QWEN3_8B, "none") == 36 * 8 * 2 * 128 * 2 == 147_456
    assert kv_bytes_per_token(QWEN3_MOE, "fp8") == 48 * 4 * 2 * 128 * 1 == 49_152  # head_dim 128 ≠ 2048 / 32 = 64
    assert kv_bytes_per_token(PHI4, "fp8") == 40 * 10 * 2 * 128 == 102_400
    assert kv_bytes_per_token(MIXTRAL, "none", tp=2) == 32 * 4 * 2 * 128 * 2


def test_gemma3_windowed_layers_hold_their_window_only():
    windows = GEMMA3_1B.layer_windows
    assert len(windows) == 26 and windows.count(None) == 4 and set(windows) == {512, None}
    assert [i for i, w in enumerate(windows) if w is None] == [5, 11, 17, 23]  # every 6th layer is global
    per_layer = 1 * 2 * 256 * 2  # one KV head of 256, K and V, 16-bit
    assert kv_bytes_per_token(GEMMA3_1B, "none", windows=windows) == 4 * per_layer == 4_096
    # 8192 tokens: 4 global layers hold all of them; 22 local layers hold 512 + the block being filled (17 blocks of 32)
    sequence = kv_bytes_per_sequence(GEMMA3_1B, "none", 1, 8192, 32, windows)
    assert sequence == (4 * 8192 + 22 * 544) * per_layer == 45_809_664
    full = kv_bytes_per_sequence(GEMMA3_1B, "none", 1, 8192, 32)
    assert full == 26 * 8192 * per_layer and round(full / sequence, 2) == 4.76


def test_gemma3_4k_sequence_blocks_against_full_attention():
    """The issue's measurement: KV blocks a 4k-token Gemma 3 sequence holds, with and without the window vector."""
    windows = GEMMA3_1B.layer_windows
    block = 32 * 1 * 2 * 256 * 2  # one layer's 32-token block
    windowed = kv_bytes_per_sequence(GEMMA3_1B, "none", 1, 4096, 32, windows) // block
    full = kv_bytes_per_sequence(GEMMA3_1B, "none", 1, 4096, 32) // block
    assert (windowed, full) == (4 * 128 + 22 * 17, 26 * 128) == (886, 3328)


def test_gpt_oss_sliding_layers_and_mla():
    assert GPT_OSS.layer_windows.count(128) == 12
    assert kv_bytes_per_token(GPT_OSS, "none", windows=GPT_OSS.layer_windows) == 12 * 8 * 2 * 64 * 2 == 24_576
    assert DEEPSEEK_V3.mla is not None and DEEPSEEK_V3.mla.cached_width == 576
    assert kv_bytes_per_token(DEEPSEEK_V3, "none") == 61 * 576 * 2 == 70_272  # 61 layers × (kv_lora_rank 512 + rope 64) × 2 B
    assert kv_bytes_per_token(DEEPSEEK_V3, "none", tp=8) == 70_272  # the latent is not split by TP


@pytest.mark.parametrize(
    ("model", "total_b", "active_b"),
    [
        (QWEN3_8B, 8.19, None),
        (QWEN3_MOE, 30.53, 3.35),
        (MIXTRAL, 46.70, 12.88),
        (GEMMA3_1B, 1.00, None),
        (PHI4, 14.66, None),
        (GPT_OSS, 20.91, 4.19),
        (DEEPSEEK_V3, 671.03, 37.55),
    ],
)
def test_parameter_counts_match_the_published_sizes(model, total_b, active_b):
    """Published: Qwen3-8B 8.2 B, Qwen3-30B-A3B 30.5 B / 3.3 B active, Mixtral 46.7 B / 12.9 B, Gemma-3-1B 1.0 B,
    Phi-4 14.7 B, GPT-OSS-20B 21 B (expert and attention biases, not counted here, make the rest), DeepSeek-V3 671 B /
    37 B (without its 14 B multi-token-prediction module)."""
    params = count_params(model)
    assert params.total / 1e9 == pytest.approx(total_b, abs=0.005)
    active = (params.read_per_token + params.embedding + params.lm_head + params.final_norm) / 1e9
    assert active == pytest.approx(active_b if active_b is not None else total_b, abs=0.005)


def test_moe_decode_bound_reads_the_active_experts_only():
    plan = plan_capacity(CapacityRequest(QWEN3_MOE, quant_algo="fp8", kv_cache_dtype="fp8", gpu="H200", max_seq_len=8192, max_batch_size=64))
    assert plan.weight_bytes / GB == pytest.approx(31.2, abs=0.05)  # every expert resident
    params = count_params(QWEN3_MOE)
    read = params.read_per_token * 1.0 + (params.embedding + params.final_norm) * 2.0
    assert plan.decode_tokens_per_s_b1 == pytest.approx(4.8e12 / read)


def test_the_engine_keeps_gemma3_windows_and_llmapi_keeps_every_familys():
    assert family_of("gemma3_text").runtime_windows(Target.engine) and family_of("gemma3_text").runtime_windows(Target.llmapi)
    assert not family_of("mistral").runtime_windows(Target.engine)  # TensorRT-LLM's LLaMA config ignores sliding_window
    assert family_of("gpt_oss").runtime_windows(Target.llmapi) and not family_of("llama").runtime_windows(Target.cpu)


def test_deepseek_v3_fp8_needs_eight_h200s():
    with pytest.raises(CapacityError, match="needs .* GB of weights per GPU"):
        plan_capacity(CapacityRequest(DEEPSEEK_V3, quant_algo="fp8", kv_cache_dtype="none", gpu="H200", max_seq_len=16384, tp=4))
    plan = plan_capacity(CapacityRequest(DEEPSEEK_V3, quant_algo="fp8", kv_cache_dtype="none", gpu="H200", max_seq_len=16384, tp=8))
    assert plan.weight_bytes_per_gpu / GB == pytest.approx(84.1, abs=0.05)

"""Paged attention over random block tables equals dense causal attention; RoPE matches HF."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refengine.model_config import RopeScaling, RopeScalingType
from refengine.model_runner.attention import build_attention_metadata, paged_attention, write_kv_cache
from refengine.model_runner.layers import RotaryEmbedding, rope_inverse_frequencies


def dense_causal_attention(q, k, v, scale):
    """Plain reference: q [L, H, D] are the last L of S tokens; k, v [S, H_kv, D]."""
    query_len, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)
    v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
    out = torch.empty_like(q)
    for j in range(query_len):
        visible = context_len - query_len + j + 1
        scores = torch.einsum("hd,shd->hs", q[j], k[:visible]) * scale
        out[j] = torch.einsum("hs,shd->hd", torch.softmax(scores, dim=-1), v[:visible])
    return out


@st.composite
def batches(draw):
    head_size = draw(st.sampled_from([4, 8]))
    num_kv_heads = draw(st.sampled_from([1, 2, 4]))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 4]))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_seqs = draw(st.integers(1, 5))
    sequences = []
    for _ in range(num_seqs):
        context_len = draw(st.integers(1, 30))
        query_len = draw(st.integers(1, context_len))
        sequences.append((context_len, query_len))
    seed = draw(st.integers(0, 2**16))
    return head_size, num_heads, num_kv_heads, block_size, sequences, seed


@settings(max_examples=60, deadline=None)
@given(batches())
def test_paged_attention_equals_dense(batch):
    head_size, num_heads, num_kv_heads, block_size, sequences, seed = batch
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_per_seq = [math.ceil(context_len / block_size) for context_len, _ in sequences]
    num_blocks = sum(blocks_per_seq) + 3
    free_blocks = list(range(num_blocks))
    rng.shuffle(free_blocks)  # random, non-contiguous block tables
    tables = [[free_blocks.pop() for _ in range(n)] for n in blocks_per_seq]
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=generator)
    keys = [torch.randn(c, num_kv_heads, head_size, generator=generator) for c, _ in sequences]
    values = [torch.randn(c, num_kv_heads, head_size, generator=generator) for c, _ in sequences]
    queries = [torch.randn(q, num_heads, head_size, generator=generator) for _, q in sequences]

    # The cached prefix is written first, then this step's tokens via the metadata's slots.
    cached = build_attention_metadata([c - q for c, q in sequences], [0] * len(sequences), tables, block_size)
    write_kv_cache(
        kv_cache,
        torch.cat([k[: c - q] for k, (c, q) in zip(keys, sequences)]),
        torch.cat([v[: c - q] for v, (c, q) in zip(values, sequences)]),
        cached.slot_mapping,
    )
    metadata = build_attention_metadata([q for _, q in sequences], [c - q for c, q in sequences], tables, block_size)
    write_kv_cache(
        kv_cache,
        torch.cat([k[c - q :] for k, (c, q) in zip(keys, sequences)]),
        torch.cat([v[c - q :] for v, (c, q) in zip(values, sequences)]),
        metadata.slot_mapping,
    )
    scale = head_size**-0.5
    paged = paged_attention(torch.cat(queries), kv_cache, metadata, scale)
    dense = torch.cat([dense_causal_attention(q, k, v, scale) for q, k, v in zip(queries, keys, values)])
    torch.testing.assert_close(paged, dense, rtol=1e-5, atol=1e-5)


def test_metadata_fields():
    metadata = build_attention_metadata([3, 1], [0, 5], [[7, 2], [4, 9]], tokens_per_block=4)
    assert metadata.query_start_loc.tolist() == [0, 3, 4]
    assert metadata.context_lens.tolist() == [3, 6]
    assert metadata.positions.tolist() == [0, 1, 2, 5]
    assert metadata.slot_mapping.tolist() == [28, 29, 30, 9 * 4 + 1]
    assert metadata.block_tables.tolist() == [[7, 2], [4, 9]]


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_frequencies_match_transformers(rope_parameters):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=128, num_attention_heads=4, rope_parameters=dict(rope_parameters))
    rope_type = rope_parameters["rope_type"]
    if rope_type == "default":
        expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    scaling = RopeScaling.from_config({k: v for k, v in rope_parameters.items() if k != "rope_theta"})
    actual = rope_inverse_frequencies(32, rope_parameters["rope_theta"], scaling)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_llama3_scaling_covers_all_frequency_bands():
    scaling = RopeScaling(RopeScalingType.LLAMA3, 8.0, 1.0, 4.0, 64)
    plain = rope_inverse_frequencies(32, 10000.0, RopeScaling())
    scaled = rope_inverse_frequencies(32, 10000.0, scaling)
    ratio = (scaled / plain).tolist()
    assert ratio[0] == 1.0  # high frequencies kept
    assert ratio[-1] == pytest.approx(1 / 8)  # low frequencies divided by factor
    assert any(1 / 8 < r < 1 for r in ratio)  # the band in between is smoothed


def test_rotary_is_a_rotation():
    rotary = RotaryEmbedding(8, 10000.0, RopeScaling())
    x = torch.randn(5, 3, 8)
    cos, sin = rotary.cos_sin(torch.arange(5))
    torch.testing.assert_close(RotaryEmbedding.apply(x, cos, sin).norm(dim=-1), x.norm(dim=-1))

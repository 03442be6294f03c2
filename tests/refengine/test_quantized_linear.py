"""Quantized Linear layers and the quantized KV cache on hand-made checkpoints (no ModelOpt).

The ModelOpt round trip is in test_quantized_exports.py; here: rounding and packing primitives,
the KV cache's codes, loading errors, and `exclude_modules`.
"""

from __future__ import annotations

import pytest
import torch

from refengine import ModelLoadError
from refengine.checkpoint import load_checkpoint
from refengine.model_runner import LlamaModel
from refengine.model_runner.attention import build_attention_metadata, paged_attention, write_kv_cache
from refengine.model_runner.kv_quant import KVCacheQuantizer
from refengine.model_runner.linear import DenseLinear
from refengine.model_runner.quant_ops import (
    pack_int4,
    quantize_fp8,
    quantize_weight_per_channel,
    round_half_away_from_zero,
    unpack_int4,
)
from refengine.model_runner.quantized_linear import Fp8Linear, Int4AwqLinear, SmoothQuantLinear
from tests.support.quant_fixtures import add_kv_cache_scales, min_cosine, paged_prefill, quantize_linears

AWQ = {"quant_algo": "W4A16_AWQ", "group_size": 16, "has_zero_point": False, "pre_quant_scale": True}


def test_int4_packing_round_trips_every_code():
    codes = torch.arange(-8, 8, dtype=torch.int8).repeat(4, 3).reshape(8, 24)
    packed = pack_int4(codes)
    assert packed.shape == (4, 24) and packed.dtype == torch.int8
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(unpack_int4(packed.view(torch.uint8)), codes)
    # row 2k in the low nibble, row 2k + 1 in the high nibble (ModelOpt 0.47 `pack_int4_in_uint8`)
    assert int(pack_int4(torch.tensor([[-1], [2]], dtype=torch.int8))[0, 0]) == 0x2F


def test_weight_only_int8_quantization_at_load():
    weight = (0.05 * torch.randn(64, 48, generator=torch.Generator().manual_seed(0))).to(torch.float16)
    codes, scale = quantize_weight_per_channel(weight, bits=8, scale_dtype=torch.float16)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (64,)
    assert codes.abs().amax(dim=1).eq(127).all()  # each channel's max maps to ±127
    step = weight.float().abs().amax(dim=1, keepdim=True) / 127
    assert ((codes.float() * step - weight.float()).abs() <= step / 2 + 1e-7).all()
    assert round_half_away_from_zero(torch.tensor([0.5, 1.5, 2.5, -2.5])).tolist() == [1.0, 2.0, 3.0, -3.0]


def test_fp8_saturates_instead_of_overflowing():
    codes = quantize_fp8(torch.tensor([1e6, -1e6, 0.3]), torch.tensor(0.5))
    assert codes.to(torch.float32).tolist() == [448.0, -448.0, 0.625]


def test_linears_follow_their_formulas():
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(5, 32, generator=gen), 0.1 * torch.randn(16, 32, generator=gen)
    w_scale, x_scale = weight.abs().max() / 448, torch.tensor(4.0 / 448)
    fp8 = Fp8Linear((weight / w_scale).to(torch.float8_e4m3fn), w_scale, x_scale, None)
    reference = quantize_fp8(x, x_scale).float() * x_scale @ ((weight / w_scale).to(torch.float8_e4m3fn).float() * w_scale).T
    torch.testing.assert_close(fp8(x), reference, rtol=1e-5, atol=1e-6)

    smoother = torch.rand(32, generator=gen) + 0.5
    codes = torch.randint(-127, 128, (16, 32), generator=gen, dtype=torch.int8)
    channel_scale, act_scale = torch.rand(16, generator=gen) / 100, torch.tensor(3.0 / 127)
    sq = SmoothQuantLinear(codes, channel_scale, act_scale, smoother, torch.ones(16))
    x_codes = torch.round(x * smoother / act_scale).clamp(-128, 127)
    expected = (x_codes * act_scale) @ (codes.float() * channel_scale[:, None]).T + 1
    torch.testing.assert_close(sq(x), expected, rtol=1e-5, atol=1e-6)

    int4 = torch.randint(-8, 8, (16, 32), generator=gen, dtype=torch.int8)
    group_scales = torch.rand(16, 2, generator=gen) / 10
    awq = Int4AwqLinear(int4, group_scales, 16, smoother, None)
    dequantized = int4.float() * group_scales.repeat_interleave(16, dim=1)
    torch.testing.assert_close(awq(x), (x * smoother) @ dequantized.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("algo", "dtype", "scale"), [("FP8", torch.float8_e4m3fn, 1.0), ("INT8", torch.int8, 0.03)])
def test_quantized_kv_cache_stores_codes(algo, dtype, scale):
    gen = torch.Generator().manual_seed(2)
    quantizer = KVCacheQuantizer(algo, torch.tensor(scale))
    kv_cache = torch.zeros(2, 3, 4, 2, 8, dtype=dtype)
    keys, values, query = (torch.randn(10, n, 8, generator=gen) for n in (2, 2, 4))
    metadata = build_attention_metadata([10], [0], [[2, 0, 1]], 4)
    write_kv_cache(kv_cache, keys, values, metadata.slot_mapping, quantizer)
    assert kv_cache.dtype == dtype and kv_cache.to(torch.float32).abs().sum() > 0
    stored = kv_cache[0, [2, 0, 1]].reshape(12, 2, 8)[:10]
    assert torch.equal(stored.to(torch.float32), quantizer.quantize(keys).to(torch.float32))
    read_back = quantizer.dequantize(stored, torch.float32)
    bound = scale / 2 + 1e-6 if algo == "INT8" else keys.abs() / 16 + 2**-9  # e4m3: 3 mantissa bits
    assert ((read_back - keys).abs() <= bound).all()
    # attention sees exactly the dequantized K/V
    plain = torch.zeros(2, 3, 4, 2, 8)
    write_kv_cache(
        plain,
        quantizer.dequantize(quantizer.quantize(keys), torch.float32),
        quantizer.dequantize(quantizer.quantize(values), torch.float32),
        metadata.slot_mapping,
    )
    torch.testing.assert_close(paged_attention(query, kv_cache, metadata, 0.3, quantizer), paged_attention(query, plain, metadata, 0.3))


@pytest.mark.parametrize(
    ("quantization", "min_cos"),
    [({"quant_algo": "FP8"}, 0.99), ({"quant_algo": "W8A8_SQ_PER_CHANNEL"}, 0.99), (AWQ, 0.95)],
)
def test_hand_quantized_checkpoints_run_close_to_float(tmp_path, checkpoint_writer, tensor_rewriter, quantization, min_cos):
    dense_dir = checkpoint_writer(tmp_path / "dense")
    quant_dir = checkpoint_writer(tmp_path / "quant", quantization=quantization)
    tensor_rewriter(quant_dir, lambda t: quantize_linears(t, quantization["quant_algo"]))
    sequences = [list(range(3, 40)), list(range(50, 60))]
    dense, _ = paged_prefill(LlamaModel.from_checkpoint(load_checkpoint(dense_dir)), sequences)
    quantized, _ = paged_prefill(LlamaModel.from_checkpoint(load_checkpoint(quant_dir)), sequences)
    for d, q in zip(dense, quantized):
        assert min_cosine(q[None], d[None]) >= min_cos
        assert not torch.equal(q, d)


def test_kv_cache_scale_is_the_max_of_k_and_v(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt", quantization={"kv_cache_quant_algo": "INT8"})
    tensor_rewriter(directory, lambda t: add_kv_cache_scales(t, 2, k_scale=0.02, v_scale=0.05))
    model = LlamaModel.from_checkpoint(load_checkpoint(directory))
    assert model.kv_cache_dtype == torch.int8
    assert all(layer.kv_quant.scale.item() == pytest.approx(0.05) for layer in model.layers)
    assert all(isinstance(layer.qkv, DenseLinear) for layer in model.layers)  # KV-only quantization


def test_exclude_modules_keep_a_linear_unquantized(tmp_path, checkpoint_writer, tensor_rewriter):
    quantization = {"quant_algo": "FP8", "exclude_modules": ["lm_head", "*.mlp.proj"]}
    directory = checkpoint_writer(tmp_path / "ckpt", quantization=quantization)

    def quantize_all_but_proj(tensors):
        proj = {n: t for n, t in tensors.items() if ".mlp.proj." in n}
        quantize_linears(tensors, "FP8")
        tensors.update(proj)
        for name in [n for n in tensors if ".mlp.proj." in n and "scaling_factor" in n]:
            del tensors[name]

    tensor_rewriter(directory, quantize_all_but_proj)
    model = LlamaModel.from_checkpoint(load_checkpoint(directory))
    assert all(isinstance(layer.proj, DenseLinear) and isinstance(layer.fc, Fp8Linear) for layer in model.layers)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        (
            {"quant_algo": "NVFP4"},
            r"quant_algo 'NVFP4' is not supported by the reference engine \(supported: FP8, W8A16, W8A8_SQ_PER_CHANNEL, W4A16_AWQ, W4A8_AWQ",
        ),
        ({"quant_algo": "W4A8_MXFP4_FP8"}, "'W4A8_MXFP4_FP8' is not supported"),
        ({"kv_cache_quant_algo": "NVFP4"}, r"kv_cache_quant_algo 'NVFP4' is not supported .*supported: FP8, INT8"),
        ({**AWQ, "has_zero_point": True}, "has_zero_point is true"),
        ({"quant_algo": "FP8", "group_size": 0}, "'group_size' must be a positive integer"),
        ({"quant_algo": 8}, "quant_algo must be a string"),
    ],
)
def test_unsupported_quantization_is_refused(tmp_path, checkpoint_writer, quantization, message):
    directory = checkpoint_writer(tmp_path / "ckpt", quantization=quantization)
    with pytest.raises(ModelLoadError, match=message):
        LlamaModel.from_checkpoint(load_checkpoint(directory))


def test_missing_or_mistyped_quantized_tensors_are_named(tmp_path, checkpoint_writer, tensor_rewriter):
    directory = checkpoint_writer(tmp_path / "ckpt", quantization={"quant_algo": "FP8"})
    with pytest.raises(ModelLoadError, match=r"'transformer.layers.0.attention.qkv.weight' has dtype torch.float16, expected float8_e4m3fn/int8"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))
    tensor_rewriter(directory, lambda t: quantize_linears(t, "FP8"))
    tensor_rewriter(directory, lambda t: t.pop("transformer.layers.1.mlp.gate.activation_scaling_factor"))
    with pytest.raises(ModelLoadError, match="'transformer.layers.1.mlp.gate.activation_scaling_factor'.* is missing"):
        LlamaModel.from_checkpoint(load_checkpoint(directory))

    awq_dir = checkpoint_writer(tmp_path / "awq", quantization={**AWQ, "group_size": 64})
    tensor_rewriter(awq_dir, lambda t: quantize_linears(t, "W4A16_AWQ"))
    with pytest.raises(ModelLoadError, match="in_features divisible by group_size 64"):
        LlamaModel.from_checkpoint(load_checkpoint(awq_dir))

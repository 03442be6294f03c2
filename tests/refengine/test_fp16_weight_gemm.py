"""EngineConfig.fp16_weight_gemm: fp16 weights computed in float32 run on fbgemm's fp16-weight GEMM (the default),
with the same weights and another summation order; off, the float32 GEMM gives F.linear's results bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from refengine import EngineConfig, LLMEngine, SamplingParams
from refengine.checkpoint import load_checkpoint
from refengine.errors import EngineConfigError
from refengine.model_runner import load_model
from refengine.model_runner.linear import DenseLinear
from refengine.model_runner.packed_linear import fp16_gemm_available

needs_fbgemm = pytest.mark.skipif(not fp16_gemm_available(), reason="this torch has no fbgemm fp16-weight GEMM")


def _dense_linears(model) -> list[DenseLinear]:
    linears = [model._logits]
    for layer in model.layers:
        linears += [layer.qkv, layer.dense, layer.fc, layer.gate, layer.proj]
    return linears


@needs_fbgemm
def test_the_target_packs_fp16_weights_and_keeps_them_as_fp16(small_checkpoint):
    packed = load_model(load_checkpoint(small_checkpoint), fp16_gemm=True)
    exact = load_model(load_checkpoint(small_checkpoint))
    assert all(linear.uses_fp16_gemm and linear.weight.dtype == torch.float16 for linear in _dense_linears(packed))
    assert not any(linear.uses_fp16_gemm for linear in _dense_linears(exact))
    for fast, plain in zip(_dense_linears(packed), _dense_linears(exact)):
        x = torch.randn(5, plain.in_features)
        assert torch.equal(fast.weight.float(), plain.weight.float())  # the same weights
        reference = F.linear(x, plain.weight.float(), plain.bias)
        assert torch.equal(plain(x), reference)  # off: F.linear bit for bit
        torch.testing.assert_close(fast(x), reference, rtol=1e-5, atol=1e-5)  # on: summation order only


def test_the_fp16_gemm_is_used_only_for_weights_that_are_fp16_values():
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(24, 16, generator=generator).half().float()
    bias = torch.randn(24, generator=generator)
    x = torch.randn(3, 16, generator=generator)
    packed = DenseLinear(exact, bias, torch.float32, fp16_gemm=True)
    assert packed.uses_fp16_gemm == fp16_gemm_available()
    torch.testing.assert_close(packed(x), F.linear(x, exact, bias), rtol=1e-5, atol=1e-5)
    not_fp16 = DenseLinear(exact + 1e-4, None, torch.float32, fp16_gemm=True)  # float32 values fp16 cannot hold
    assert not not_fp16.uses_fp16_gemm and not_fp16.weight.dtype == torch.float32
    assert torch.equal(not_fp16(x), F.linear(x, exact + 1e-4))  # the float32 GEMM, exactly


def test_greedy_output_is_the_same_with_either_gemm(small_checkpoint):
    prompts = [[1, 5, 9, 13, 2, 7], [3, 3, 8], list(range(4, 30))]
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outputs = {}
    for gemm in (True, False):
        engine = LLMEngine.from_checkpoint(small_checkpoint, EngineConfig(tokens_per_block=4, max_seq_len=64, max_input_len=32, fp16_weight_gemm=gemm))
        outputs[gemm] = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    assert outputs[True] == outputs[False]


def test_fp16_weight_gemm_must_be_a_bool():
    with pytest.raises(EngineConfigError, match="fp16_weight_gemm: must be true or false, got 'yes'"):
        EngineConfig(fp16_weight_gemm="yes")

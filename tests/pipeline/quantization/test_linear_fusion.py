"""Fusing the Linears TensorRT-LLM runs as one GEMM (q/k/v, gate/up): concat_rows and share_scalar_scales, on tensors
shaped as ModelOpt's unified checkpoint stores them."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.linear import FP8, Linear, concat_rows, read_linear, share_scalar_scales


def _int8(name: str, rows: int, scale: torch.Tensor | None) -> Linear:
    return Linear(name, torch.ones(rows, 4, dtype=torch.int8), weight_scale=scale)


def test_concat_rows_joins_weights_biases_and_per_row_scales() -> None:
    q = Linear("q", torch.zeros(2, 4), bias=torch.zeros(2), weight_scale=torch.full((2,), 0.5))
    k = Linear("k", torch.ones(3, 4), bias=torch.ones(3), weight_scale=torch.full((3,), 0.25))
    fused = concat_rows([q, k], "qkv")
    assert fused.name == "qkv" and fused.weight.shape == (5, 4)
    assert torch.equal(fused.bias, torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))
    assert torch.equal(fused.weight_scale, torch.tensor([0.5, 0.5, 0.25, 0.25, 0.25]))


def test_concat_rows_refuses_a_per_row_scale_beside_none() -> None:
    # found by mypy: torch.cat met the missing scale and raised a TypeError instead of naming the Linears
    with pytest.raises(StageError, match="q, k: some have a per-row weight_scale, some none"):
        concat_rows([_int8("q", 2, torch.full((2,), 0.5)), _int8("k", 2, None)], "qk")


def test_concat_rows_refuses_a_scalar_scale_after_none() -> None:
    # found by mypy: torch.equal compared the scale with the first Linear's None and raised a TypeError
    with pytest.raises(StageError, match="q, k disagree on weight_scale"):
        concat_rows([_int8("q", 2, None), _int8("k", 2, torch.tensor(0.5))], "qk")


def test_concat_rows_refuses_a_bias_on_only_some() -> None:
    with pytest.raises(StageError, match="some have a bias, some not"):
        concat_rows([Linear("q", torch.zeros(2, 4), bias=torch.zeros(2)), Linear("k", torch.zeros(2, 4))], "qk")


def test_share_scalar_scales_requantizes_fp8_weights_to_the_largest_scale() -> None:
    weights = torch.tensor([[1.0, -2.0]]).to(FP8)
    small = Linear("q", weights, weight_scale=torch.tensor(1.0), input_scale=torch.tensor(0.5))
    large = Linear("k", weights, weight_scale=torch.tensor(2.0), input_scale=torch.tensor([0.75]))
    q, k = share_scalar_scales([small, large])
    assert torch.equal(q.weight_scale, torch.tensor(2.0)) and torch.equal(k.weight_scale, torch.tensor(2.0))
    assert torch.equal(q.weight.float(), torch.tensor([[0.5, -1.0]])) and k.weight is weights  # k already had the scale
    assert torch.equal(q.input_scale, torch.tensor(0.75)) and torch.equal(k.input_scale, torch.tensor([0.75]))  # shapes kept


def test_share_scalar_scales_refuses_w4a8_second_scales_that_disagree() -> None:
    first = Linear("q", torch.zeros(1, 2, dtype=torch.uint8), weight_scale_2=torch.tensor(1.0))
    second = Linear("k", torch.zeros(1, 2, dtype=torch.uint8), weight_scale_2=torch.tensor(2.0))
    with pytest.raises(StageError, match="disagree on weight_scale_2"):
        share_scalar_scales([first, second])


def test_read_linear_reads_the_suffixes_and_names_a_missing_weight() -> None:
    tensors = {"m.weight": torch.zeros(2, 2), "m.input_scale": torch.tensor(1.0)}
    linear = read_linear(tensors, "m")
    assert linear.weight is tensors["m.weight"] and linear.input_scale is tensors["m.input_scale"] and linear.bias is None
    with pytest.raises(StageError, match="tensor n.weight is missing"):
        read_linear(tensors, "n")

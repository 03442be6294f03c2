"""FP8 KV-cache scales below 1.0 reach the TensorRT-LLM checkpoint unclamped (issue #41).

ModelOpt 0.47's TRT export clamped FP8 K/V scales to >= 1.0; the converter writes the unified export's scales
(amax / 448) as NVIDIA/TensorRT-LLM's 1.2 loaders read them (convert.py `_kv_cache_scales`; the measurement behind
the choice: BENCHMARKS.md#fp8-kv-cache-scales-clamped-or-raw-cpu-issue-41). A tiny random Llama's K/V activations are
small, so every calibrated scale is far below 1: the case where the clamp would change them.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.quantization.trtllm_checkpoint.convert import _kv_cache_scales, convert_unified_checkpoint, load_tensors
from pipeline.quantization.trtllm_checkpoint.layout import layout_for
from pipeline.quantization.trtllm_checkpoint.pretrained import pretrained_config

LAYERS = 2


@pytest.fixture(scope="module")
def unified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ModelOpt's unified export of a calibrated tiny Llama with FP8 weights and an FP8 KV cache."""
    import modelopt.torch.quantization as mtq
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.quantization.modelopt_export import QuantRecipe, _mtq_config
    from pipeline.quantization.unified_export import export_unified_checkpoint

    root = tmp_path_factory.mktemp("kv-scales")
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        architectures=["LlamaForCausalLM"],
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.float16).eval()
    batches = [torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        model = mtq.quantize(model, _mtq_config(QuantRecipe("fp8", "fp8")), lambda m: [m(b) for b in batches])
        export_unified_checkpoint(model, root / "unified", dtype=torch.float16)
    return root / "unified"


def _convert(unified: Path, out: Path, tp: int) -> dict:
    import json

    hf = json.loads((unified / "config.json").read_text())
    config = pretrained_config(hf, dtype="float16", mapping={"world_size": tp, "tp_size": tp, "pp_size": 1}, quantization={})
    return convert_unified_checkpoint(unified, out, config=config, tp_size=tp, pp_size=1)


def _raw_scales(unified: Path) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    tensors = load_tensors(unified)
    a = "model.layers.{}.self_attn."
    return {i: (tensors[a.format(i) + "k_proj.k_scale"].float(), tensors[a.format(i) + "v_proj.v_scale"].float()) for i in range(LAYERS)}


def test_fp8_kv_scales_below_one_are_written_unclamped_on_every_rank(unified: Path, tmp_path: Path) -> None:
    raw = _raw_scales(unified)
    assert all(0 < float(s) < 1.0 for pair in raw.values() for s in pair), raw  # the case the clamp would change
    config = _convert(unified, tmp_path / "tp2", tp=2)
    assert config["quantization"]["kv_cache_quant_algo"] == "FP8"
    for rank in ("rank0.safetensors", "rank1.safetensors"):
        tensors = load_file(tmp_path / "tp2" / rank)
        for layer, (k, v) in raw.items():
            p = f"transformer.layers.{layer}.attention."
            assert torch.equal(tensors[p + "k_cache_scaling_factor"], k.reshape(1)), (rank, layer)
            assert torch.equal(tensors[p + "v_cache_scaling_factor"], v.reshape(1)), (rank, layer)
            assert torch.equal(tensors[p + "kv_cache_scaling_factor"], torch.maximum(k, v).reshape(1)), (rank, layer)


def test_the_benchmarks_clamp_writes_what_modelopt_047s_trt_export_wrote(unified: Path) -> None:
    """`clamp_fp8=True` (bench/kv_clamp_bench.py's other side): every scale below 1 becomes 1.0."""
    tensors, layout = load_tensors(unified), layout_for("llama")
    config = {"quantization": {"kv_cache_quant_algo": "FP8"}}
    for layer in range(LAYERS):
        hf, prefix = f"model.layers.{layer}", f"transformer.layers.{layer}.attention"
        clamped = _kv_cache_scales(tensors, hf, layout, config, prefix, clamp_fp8=True)
        assert {name: float(t) for name, t in clamped.items()} == {f"{prefix}.{kind}_cache_scaling_factor": 1.0 for kind in ("k", "v", "kv")}
        assert _kv_cache_scales(tensors, hf, layout, config, prefix) != clamped


def test_the_cpu_engine_quantizes_its_kv_cache_with_the_raw_scale(unified: Path, tmp_path: Path) -> None:
    from refengine.checkpoint import load_checkpoint
    from refengine.model_runner import load_model

    _convert(unified, tmp_path / "tp1", tp=1)
    model = load_model(load_checkpoint(tmp_path / "tp1"))
    for layer, (k, v) in _raw_scales(unified).items():
        quantizer = model.layers[layer].kv_quant
        assert quantizer is not None and quantizer.algo == "FP8"
        assert float(quantizer.scale) == float(torch.maximum(k, v)) < 1.0
        x = torch.full((1, 2, 32), 0.5 * float(quantizer.scale))  # far below scale 1.0 granularity: exact here
        assert torch.equal(quantizer.dequantize(quantizer.quantize(x), torch.float32), x)

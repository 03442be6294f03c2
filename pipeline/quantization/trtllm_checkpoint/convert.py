"""ModelOpt's unified Hugging Face checkpoint -> TensorRT-LLM checkpoint (config.json + rank{N}.safetensors).

The project's replacement for ModelOpt's `export_tensorrt_llm_checkpoint` (deprecated in 0.48, removed in 0.49):
quantize with ModelOpt, export the unified checkpoint with `export_hf_checkpoint` (safetensors +
hf_quant_config.json), then convert it here. The output has the tensor names, shapes, dtypes, sharding and
scale tensors ModelOpt 0.47's own TensorRT-LLM export writes (tests/pipeline/quantization/test_trtllm_convert.py compares the two):

  * rank N = tp_rank + pp_rank * tp_size; pipeline stages hold consecutive layers numbered from 0, the vocab
    embedding on the first stage, `ln_f` and `lm_head` on the last (postprocess._split_model_config_for_pp);
  * `attention.qkv` on each TP rank is [q_r; k_r; v_r]; KV heads are repeated when tp_size > num_key_value_heads;
  * the vocab embedding and lm_head rows are zero-padded to a multiple of tp_size (and, for the AWQ formats, first
    to a multiple of 64, which changes `vocab_size`; postprocess.pad_embedding_lm_head);
  * q/k/v and gate/up share their per-tensor scales (the max; FP8 weights are re-quantized to it), because the
    unified export keeps one scale per projection for FP8 while TensorRT-LLM runs one GEMM;
  * AWQ: the unified export folds the pre-quant scale of q/k/v and gate/up into the preceding norm weight; those
    norms are written folded, with a pre-quant scale of ones (the same product, so the same model);
  * mixture-of-experts blocks (Mixtral, Qwen2-MoE, Qwen3-MoE; unquantized or FP8) are stacked per expert by
    `trtllm_convert_moe`, in TensorRT-LLM's own layout (ModelOpt 0.47's TRT export cannot write them);
  * KV cache: the K and V scales are the unified export's (amax / 448 for FP8), not clamped to at least 1.0 as
    ModelOpt 0.47's TRT export clamps FP8 ones (see `_kv_cache_scales`); `kv_cache_scaling_factor` is their max.

Pure torch + safetensors: ModelOpt is not imported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pipeline.errors import StageError
from pipeline.quant_formats import weight_format_named
from pipeline.quantization.trtllm_checkpoint.layout import Layout, layout_for
from pipeline.quantization.trtllm_checkpoint.linear import (
    Linear,
    column_shard,
    concat_rows,
    read_linear,
    repeat_heads,
    row_shard,
    share_scalar_scales,
    split_rows,
    trtllm_tensors,
)
from pipeline.quantization.trtllm_checkpoint.moe import check_moe_quantization, moe_layer_tensors, moe_mapping

__all__ = ["convert_unified_checkpoint", "HF_QUANT_CONFIG"]

HF_QUANT_CONFIG = "hf_quant_config.json"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# quant_algo the config may ask for while the unified checkpoint holds 16-bit weights: trtllm-build quantizes them
_BUILD_TIME_QUANT = ("W8A16",)
_AWQ_VOCAB_MULTIPLE = 64


def _group_wise(quant_algo: str | None) -> bool:
    """The checkpoint's quant_algo is a group-wise INT4 (AWQ) format of pipeline.quant_formats."""
    weights = weight_format_named(quant_algo)
    return weights is not None and weights.group_wise


def convert_unified_checkpoint(unified_dir: Path, out_dir: Path, *, config: dict, tp_size: int, pp_size: int) -> dict:
    """Write the TensorRT-LLM checkpoint of `unified_dir` into `out_dir`; return the config.json written.

    `config` is the checkpoint's config.json body (architecture, sizes, family keys); its `mapping` and
    `quantization` are set here from tp_size/pp_size and hf_quant_config.json (a quant_algo it already names must
    agree, except W8A16, whose 16-bit weights trtllm-build quantizes).
    """
    unified_dir, out_dir = Path(unified_dir), Path(out_dir)
    model_type = read_json(unified_dir / "config.json").get("model_type")
    layout = layout_for(str(model_type))
    tensors = load_tensors(unified_dir)
    config = json.loads(json.dumps(config))  # a deep copy the caller keeps unchanged
    config["quantization"] = _quantization(unified_dir, config.get("quantization") or {}, layout)
    _check_mapping(config, tp_size, pp_size)
    config["mapping"] = {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size, **moe_mapping(config, tp_size)}
    if layout.moe is not None:
        check_moe_quantization(config, str(model_type))
    dtype = _DTYPES.get(config.get("dtype", ""))
    if dtype is None:
        raise StageError(f"config dtype {config.get('dtype')!r} is not one of {', '.join(_DTYPES)}")

    quant_algo = config["quantization"].get("quant_algo")
    vocab = int(config["vocab_size"])
    if _group_wise(quant_algo) and vocab % _AWQ_VOCAB_MULTIPLE:
        config["vocab_size"] = math.ceil(vocab / _AWQ_VOCAB_MULTIPLE) * _AWQ_VOCAB_MULTIPLE

    layers = int(config["num_hidden_layers"])
    per_stage = layers // pp_size
    out_dir.mkdir(parents=True, exist_ok=True)
    for pp_rank in range(pp_size):
        stage = range(pp_rank * per_stage, (pp_rank + 1) * per_stage)
        for tp_rank in range(tp_size):
            rank_tensors: dict[str, torch.Tensor] = {}
            for local, layer in enumerate(stage):
                prefix = f"transformer.layers.{local}"
                rank_tensors.update(layer_tensors(tensors, layout, config, layer, prefix, tp_size, tp_rank, dtype))
            rank_tensors.update(_top_tensors(tensors, layout, config, pp_rank, pp_size, tp_size, tp_rank, dtype))
            save_file(unshared(rank_tensors), str(out_dir / f"rank{tp_rank + pp_rank * tp_size}.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    return config


# -- reading -----------------------------------------------------------------------------------------------------
def read_json(path: Path, what: str | None = "unified checkpoint") -> dict[str, Any]:
    """The JSON object in `path`; StageError (prefixed with `what`, if any) naming the file."""
    prefix = f"{what}: " if what else ""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{prefix}cannot read {path} ({exc})") from None
    if not isinstance(value, dict):
        raise StageError(f"{prefix}{path} is not a JSON object")
    return value


def load_tensors(unified_dir: Path, what: str = "unified checkpoint") -> dict[str, torch.Tensor]:
    """Every tensor of the directory's *.safetensors files; StageError (prefixed with `what`) naming the file."""
    files = sorted(unified_dir.glob("*.safetensors"))
    if not files:
        raise StageError(f"{what}: {unified_dir} has no *.safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise StageError(f"{what}: cannot read {path} ({exc})") from None
        twice = sorted(set(part) & set(tensors))
        if twice:
            raise StageError(f"{what}: tensor {twice[0]} is in {path.name} and another file")
        tensors.update(part)
    return tensors


def _quantization(unified_dir: Path, requested: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The `quantization` block ModelOpt 0.47's TRT export writes for what hf_quant_config.json says."""
    path = unified_dir / HF_QUANT_CONFIG
    found = (read_json(path).get("quantization") or {}) if path.is_file() else {}
    block: dict[str, Any] = {"quant_algo": found.get("quant_algo"), "kv_cache_quant_algo": found.get("kv_cache_quant_algo")}
    if found.get("quantized_layers"):  # MIXED_PRECISION (AutoQuant): per-layer formats, a GPU-only path
        raise StageError(f"{path}: per-layer mixed precision (quantized_layers) is not converted")
    for key, value in found.items():
        if key == "quantized_layers":  # written empty when only the KV cache is quantized
            continue
        if key == "exclude_modules":
            block[key] = [m for m in (layout.hf_to_trtllm(name) for name in value) if m is not None]
        elif key not in block:
            block[key] = value
    wanted = requested.get("quant_algo")
    if wanted in _BUILD_TIME_QUANT and block["quant_algo"] is None:
        block["quant_algo"] = wanted
    for key in ("quant_algo", "kv_cache_quant_algo"):
        if requested.get(key) is not None and requested[key] != block[key]:
            raise StageError(
                f"{path}: {key} is {block[key]!r}, but the TensorRT-LLM config asks for {requested[key]!r}",
                hint="quantize and export again with the requested recipe",
            )
    return block


def _check_mapping(config: dict[str, Any], tp: int, pp: int) -> None:
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    problems = []
    if tp < 1 or pp < 1:
        problems.append(f"tp_size {tp} and pp_size {pp} must be >= 1")
    else:
        if heads % tp:
            problems.append(f"num_attention_heads {heads} is not divisible by tp_size {tp}")
        if kv_heads % tp and tp % kv_heads:
            problems.append(f"num_key_value_heads {kv_heads} and tp_size {tp}: neither divides the other")
        if int(config["num_hidden_layers"]) % pp:
            problems.append(f"num_hidden_layers {config['num_hidden_layers']} is not divisible by pp_size {pp}")
    if problems:
        raise StageError("TensorRT-LLM checkpoint conversion: " + "; ".join(problems))


# -- one decoder layer -------------------------------------------------------------------------------------------
def layer_tensors(
    tensors: dict[str, torch.Tensor],
    layout: Layout,
    config: dict[str, Any],
    layer: int,
    prefix: str,
    tp: int,
    rank: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    hf = f"{layout.layers}.{layer}"
    awq = _group_wise(config["quantization"].get("quant_algo"))
    out: dict[str, torch.Tensor] = {}

    def linear(name: str) -> Linear:
        lin = read_linear(tensors, f"{hf}.{name}")
        if awq and lin.pre_quant_scale is None:  # folded into the norm before it by the unified export
            lin = replace(lin, pre_quant_scale=torch.ones(lin.weight.shape[1], dtype=dtype))
        return lin

    if layout.qkv_fused:
        heads = int(config["num_attention_heads"])
        head_size = int(config.get("head_size") or int(config["hidden_size"]) // heads)
        kv_rows = int(config.get("num_key_value_heads") or heads) * head_size
        q, k, v = split_rows(linear(layout.qkv_fused), [heads * head_size, kv_rows, kv_rows], [layout.q, layout.k, layout.v])
    else:
        q, k, v = linear(layout.q), linear(layout.k), linear(layout.v)
    q, k, v = share_scalar_scales([q, k, v])
    out.update(_qkv(q, k, v, config, f"{prefix}.attention.qkv", tp, rank, dtype))
    out.update(trtllm_tensors(row_shard(linear(layout.dense), tp, rank), f"{prefix}.attention.dense", dtype))
    if layout.moe is not None:
        out.update(moe_layer_tensors(tensors, layout.moe, config, hf, prefix, tp, rank, dtype))
    else:
        out.update(_dense_mlp(linear, layout, prefix, tp, rank, dtype))
    for trt_name, hf_name in layout.norms.items():
        out.update(_norm(tensors, f"{hf}.{hf_name}", f"{prefix}.{trt_name}", dtype, layout.norm_plus_one))
    out.update(_kv_cache_scales(tensors, hf, layout, config, f"{prefix}.attention"))
    return out


def _dense_mlp(linear: Callable[[str], Linear], layout: Layout, prefix: str, tp: int, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if layout.gate_up_fused:
        out.update(trtllm_tensors(_up_gate_shard(linear(layout.gate_up_fused), tp, rank), f"{prefix}.mlp.fc", dtype))
    else:
        mlp = [linear(layout.fc)] + ([linear(layout.gate)] if layout.gate else [])
        for trt_name, lin in zip(("mlp.fc", "mlp.gate"), share_scalar_scales(mlp)):
            out.update(trtllm_tensors(column_shard(lin, tp, rank), f"{prefix}.{trt_name}", dtype))
    out.update(trtllm_tensors(row_shard(linear(layout.proj), tp, rank), f"{prefix}.mlp.proj", dtype))
    return out


def _up_gate_shard(gate_up: Linear, tp: int, rank: int) -> Linear:
    """Rank `rank`'s Phi-3 `mlp.fc`: rows [up_r; gate_r] of HF's gate_up_proj [gate; up] (one Linear, one scale)."""
    half = gate_up.out_features // 2
    gate, up = split_rows(gate_up, [half, half], [f"{gate_up.name}[gate]", f"{gate_up.name}[up]"])
    return concat_rows([column_shard(up, tp, rank), column_shard(gate, tp, rank)], gate_up.name)


def _qkv(q: Linear, k: Linear, v: Linear, config: dict[str, Any], prefix: str, tp: int, rank: int, dtype: torch.dtype):
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_size = int(config.get("head_size") or int(config["hidden_size"]) // heads)
    if tp > kv_heads:
        k, v = (repeat_heads(t, head_size, tp // kv_heads) for t in (k, v))
    shards = [column_shard(t, tp, rank) for t in (q, k, v)]
    return trtllm_tensors(concat_rows(shards, prefix), prefix, dtype)


def _norm(tensors: dict[str, torch.Tensor], hf_name: str, trt_name: str, dtype: torch.dtype, plus_one: bool = False) -> dict[str, torch.Tensor]:
    if f"{hf_name}.weight" not in tensors:
        raise StageError(f"unified checkpoint: tensor {hf_name}.weight is missing")
    weight = tensors[f"{hf_name}.weight"]
    out = {f"{trt_name}.weight": (weight.float() + 1.0 if plus_one else weight).to(dtype).contiguous()}
    if f"{hf_name}.bias" in tensors:
        out[f"{trt_name}.bias"] = tensors[f"{hf_name}.bias"].to(dtype).contiguous()
    return out


def _kv_cache_scales(
    tensors: dict[str, torch.Tensor], hf: str, layout: Layout, config: dict[str, Any], prefix: str, *, clamp_fp8: bool = False
) -> dict[str, torch.Tensor]:
    """One layer's K/V cache scales as the unified checkpoint holds them (FP8: amax / 448), not clamped.

    NVIDIA/TensorRT-LLM (1.2 line) takes a unified checkpoint's `k_scale` / `v_scale` as they are: tensorrt_llm/layers/
    attention.py `Attention.postprocess` (their max) and models/modeling_utils.py `preprocess_weights`. ModelOpt 0.47's
    TRT export clamps FP8 ones to >= 1.0 (modelopt/torch/export/quant_utils.py `get_kv_cache_scaling_factor`);
    `clamp_fp8=True` does so for bench/kv_clamp_bench.py, which measured the clamp no better on the default model and
    worse once K/V activations are small (BENCHMARKS.md#fp8-kv-cache-scales-clamped-or-raw-cpu-issue-41).
    """
    kv_algo = config["quantization"].get("kv_cache_quant_algo")
    if kv_algo is None:
        return {}
    names = (f"{hf}.{layout.k}.k_scale", f"{hf}.{layout.v}.v_scale")
    missing = [n for n in names if n not in tensors]
    if missing:
        raise StageError(f"unified checkpoint: kv_cache_quant_algo is {kv_algo}, but tensor {missing[0]} is missing")
    k_scale, v_scale = (tensors[n].float().reshape(1) for n in names)
    if kv_algo == "FP8" and clamp_fp8:
        k_scale, v_scale = (torch.clamp(s, min=1.0) for s in (k_scale, v_scale))
    return {
        f"{prefix}.k_cache_scaling_factor": k_scale,
        f"{prefix}.v_cache_scaling_factor": v_scale,
        f"{prefix}.kv_cache_scaling_factor": torch.maximum(k_scale, v_scale),
    }


# -- embedding, final norm, lm_head ------------------------------------------------------------------------------
def _top_tensors(
    tensors: dict[str, torch.Tensor],
    layout: Layout,
    config: dict[str, Any],
    pp_rank: int,
    pp: int,
    tp: int,
    rank: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    vocab = int(config["vocab_size"])
    if f"{layout.embedding}.weight" not in tensors:
        raise StageError(f"unified checkpoint: tensor {layout.embedding}.weight is missing")
    embedding = tensors[f"{layout.embedding}.weight"]
    if pp_rank == 0:
        table = _pad_rows(embedding, vocab)
        if config.get("use_parallel_embedding", False) and tp > 1:
            if int(config.get("embedding_sharding_dim", 0)) == 0:
                table = _pad_rows(table, math.ceil(vocab / tp) * tp).chunk(tp, dim=0)[rank]
            else:
                table = table.chunk(tp, dim=1)[rank]
        out["transformer.vocab_embedding.weight"] = table.to(dtype).contiguous()
    if pp_rank == pp - 1:
        out.update(_norm(tensors, layout.final_norm, "transformer.ln_f", dtype, layout.norm_plus_one))
        if not config.get("share_embedding_table", False):
            head = read_linear(tensors, "lm_head") if "lm_head.weight" in tensors else Linear("lm_head", embedding)
            if head.weight_scale is not None:
                raise StageError("unified checkpoint: a quantized lm_head is not converted (ModelOpt excludes it)")
            weight = _pad_rows(head.weight, math.ceil(vocab / tp) * tp)
            bias = None if head.bias is None else torch.nn.functional.pad(head.bias, (0, weight.shape[0] - head.bias.shape[0]))
            head = column_shard(Linear("lm_head", weight, bias), tp, rank)
            out.update(trtllm_tensors(head, "lm_head", dtype))
    return out


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (a scale shared by q/k/v or gate/up, a tied lm_head)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] >= rows:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, 0, rows - tensor.shape[0]))

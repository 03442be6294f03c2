"""The TensorRT-LLM checkpoint of an EAGLE-1/2 model: the base checkpoint the quantize stage wrote, plus the user's
EAGLE draft layer (SafeAILab EAGLE's layout: pipeline.config.eagle_checks) under TensorRT-LLM's names, and the config
keys of EagleForCausalLM. What examples/eagle/convert_checkpoint.py writes and tensorrt_llm/models/eagle/{config,model}.py
read (TensorRT-LLM 1.2):

  * config.json: architecture EagleForCausalLM, num_eagle_layers (the tree's depth), max_non_leaves_per_layer,
    max_draft_len, and eagle_net_config, a LlamaForCausalLM config of the draft layer (its sizes, the base's vocabulary,
    rope and mapping, no quantization);
  * per EagleNet i < num_eagle_layers, the same trained layer again (convert_checkpoint.py loads it into every
    `eagle_nets.{i}`): `eagle_nets.{i}.drafter.fc.{weight,bias}` (ColumnLinear 2H -> H, rows split over tp),
    `eagle_nets.{i}.drafter.vocab_embedding.weight` (embed_tokens: split over tp like the base's vocab_embedding when the
    checkpoint's use_parallel_embedding is on, since PretrainedModel.__post_init__'s parallelize_embedding
    (tensorrt_llm/models/modeling_utils.py) splits every Embedding of the model by the top config; else whole), the
    decoder layers as a Llama
    checkpoint's (`eagle_nets.{i}.drafter.layers.{l}.attention.qkv`, `.attention.dense`, `.mlp.fc` (gate_proj),
    `.mlp.gate` (up_proj), `.mlp.proj`, `.post_layernorm`, and `.input_layernorm` from layer 1 on), and
    `eagle_nets.{i}.lm_head.weight`, the base model's lm_head (the converter's base loader fills it);
  * the drafter's mapping is tp_size = world_size (EagleForCausalLM sets it): pp_size must be 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.backends.engine.medusa_checkpoint import copy_side_files, read_base_checkpoint
from pipeline.config.eagle_tree import max_non_leaves
from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.convert import layer_tensors, load_tensors, read_json, unshared
from pipeline.quantization.trtllm_checkpoint.layout import layout_for
from pipeline.quantization.trtllm_checkpoint.linear import column_shard, read_linear, trtllm_tensors
from refengine.speculative.medusa_tree import tree_depth

__all__ = ["EAGLE_ARCHITECTURE", "write_eagle_checkpoint"]

EAGLE_ARCHITECTURE = "EagleForCausalLM"
_LLAMA = layout_for("llama")
# EagleNet: no input norm in the first layer (use_input_layernorm_in_first_layer False), none missing after it
_FIRST_LAYER = dataclasses.replace(_LLAMA, layers="layers", norms=MappingProxyType({"post_layernorm": "post_attention_layernorm"}))
_LATER_LAYERS = dataclasses.replace(_LLAMA, layers="layers")


def write_eagle_checkpoint(base_dir: Path, eagle_dir: Path, out_dir: Path, *, choices: list[list[int]], max_draft_len: int) -> dict[str, Any]:
    """Write base + EAGLE draft layer into `out_dir` (a new directory); return its config.json."""
    config, dtype, tp, pp = read_base_checkpoint(base_dir)
    if pp != 1:
        raise StageError(f"{base_dir / 'config.json'}: pp_size {pp}: TensorRT-LLM's EAGLE does not support pipeline parallelism")
    eagle_config = read_json(eagle_dir / "config.json", None)
    eagle = load_tensors(eagle_dir, "build.speculative.eagle.heads")
    num_eagle_layers = tree_depth(choices)
    out_dir.mkdir(parents=True, exist_ok=False)
    for rank in range(tp):
        base = load_file(str(base_dir / f"rank{rank}.safetensors"))
        if "lm_head.weight" not in base:
            raise StageError(f"{base_dir / f'rank{rank}.safetensors'} has no lm_head.weight, which every EagleNet reuses")
        drafter = _drafter(eagle, eagle_config, tp, rank, dtype)
        drafter["vocab_embedding.weight"] = _embedding_shard(drafter["vocab_embedding.weight"], config, tp, rank)
        for net in range(num_eagle_layers):
            base.update({f"eagle_nets.{net}.drafter.{name}": tensor.clone() for name, tensor in drafter.items()})
            base[f"eagle_nets.{net}.lm_head.weight"] = base["lm_head.weight"].clone()
        save_file(unshared(base), str(out_dir / f"rank{rank}.safetensors"))
    copy_side_files(base_dir, out_dir)
    config = {
        **config,
        "architecture": EAGLE_ARCHITECTURE,
        "num_eagle_layers": num_eagle_layers,
        "max_non_leaves_per_layer": max_non_leaves(choices),
        "max_draft_len": max_draft_len,
        "eagle_net_config": _eagle_net_config(config, eagle_config),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    return config


def _drafter(eagle: dict[str, torch.Tensor], eagle_config: dict[str, Any], tp: int, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One rank's EagleNet drafter tensors, named inside `drafter.`."""
    heads = int(eagle_config["num_attention_heads"])
    layer_config = {
        "num_attention_heads": heads,
        "num_key_value_heads": int(eagle_config.get("num_key_value_heads") or heads),
        "hidden_size": int(eagle_config["hidden_size"]),
        "head_size": _head_dim(eagle_config),
        "quantization": {},
    }
    if "embed_tokens.weight" not in eagle:
        raise StageError("build.speculative.eagle.heads: the EAGLE checkpoint has no tensor embed_tokens.weight")
    out = {"vocab_embedding.weight": eagle["embed_tokens.weight"].to(dtype).contiguous()}
    out.update(trtllm_tensors(column_shard(read_linear(eagle, "fc"), tp, rank), "fc", dtype))
    for layer in range(int(eagle_config["num_hidden_layers"])):
        layout = _FIRST_LAYER if layer == 0 else _LATER_LAYERS
        out.update(layer_tensors(eagle, layout, layer_config, layer, f"layers.{layer}", tp, rank, dtype))
    return out


def _embedding_shard(table: torch.Tensor, config: dict[str, Any], tp: int, rank: int) -> torch.Tensor:
    """This rank's part of the drafter's embedding, as parallelize_embedding sizes it: rows zero-padded to a multiple of
    tp then split (embedding_sharding_dim 0), or columns split (1); the whole table without use_parallel_embedding."""
    if not config.get("use_parallel_embedding", False) or tp == 1:
        return table
    if int(config.get("embedding_sharding_dim", 0)) == 0:
        rows = math.ceil(table.shape[0] / tp) * tp
        table = torch.nn.functional.pad(table, (0, 0, 0, rows - table.shape[0]))
        return table.chunk(tp, dim=0)[rank].contiguous()
    if table.shape[1] % tp:
        raise StageError(f"the EAGLE embedding's {table.shape[1]} columns do not split over tp_size {tp} (embedding_sharding_dim 1)")
    return table.chunk(tp, dim=1)[rank].contiguous()


def _head_dim(eagle_config: dict[str, Any]) -> int:
    return int(eagle_config.get("head_dim") or int(eagle_config["hidden_size"]) // int(eagle_config["num_attention_heads"]))


def _eagle_net_config(config: dict[str, Any], eagle_config: dict[str, Any]) -> dict[str, Any]:
    """The draft layer's LlamaForCausalLM config, as convert_checkpoint.py writes eagle_net_config."""
    heads = int(eagle_config["num_attention_heads"])
    return {
        "architecture": "LlamaForCausalLM",
        "dtype": config["dtype"],
        "logits_dtype": config.get("logits_dtype", "float32"),
        "num_hidden_layers": int(eagle_config["num_hidden_layers"]),
        "num_attention_heads": heads,
        "hidden_size": int(eagle_config["hidden_size"]),
        "intermediate_size": int(eagle_config["intermediate_size"]),
        "num_key_value_heads": int(eagle_config.get("num_key_value_heads") or heads),
        "vocab_size": config["vocab_size"],
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": int(eagle_config.get("max_position_embeddings") or config["max_position_embeddings"]),
        "hidden_act": eagle_config.get("hidden_act", "silu"),
        "rotary_base": config.get("rotary_base", 10000.0),
        "rotary_scaling": config.get("rotary_scaling"),
        "norm_epsilon": float(eagle_config.get("rms_norm_eps", 1e-6)),
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        "mapping": config.get("mapping"),
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "head_dim": _head_dim(eagle_config),
        "head_size": _head_dim(eagle_config),
    }


def command(base_dir: Path, eagle_dir: Path, out_dir: Path, choices: list[list[int]], max_draft_len: int) -> list[str]:
    """This writer as a command (a GPU host's dry run: run it after the quantize job, before trtllm-build)."""
    return ["python3", "-m", __name__, str(base_dir), str(eagle_dir), str(out_dir), "--choices", json.dumps(choices), "--max-draft-len", str(max_draft_len)]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python3 -m {__name__}", description="write the TensorRT-LLM checkpoint of an EAGLE-1/2 model")
    parser.add_argument("base_dir", type=Path, help="the base model's TensorRT-LLM checkpoint")
    parser.add_argument("eagle_dir", type=Path, help="the EAGLE-1/2 draft checkpoint (config.json + safetensors)")
    parser.add_argument("out_dir", type=Path, help="the EAGLE checkpoint to write (a new directory)")
    parser.add_argument("--choices", type=json.loads, required=True, help="the eagle_choices tree, as JSON")
    parser.add_argument("--max-draft-len", type=int, required=True, help="trtllm-build --max_draft_len (>= the tree's nodes)")
    args = parser.parse_args(argv)
    try:
        write_eagle_checkpoint(args.base_dir, args.eagle_dir, args.out_dir, choices=args.choices, max_draft_len=args.max_draft_len)
    except StageError as exc:
        print(f"eagle checkpoint: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Read an unquantized TensorRT-LLM checkpoint back into Hugging Face Llama-family tensor names (Phi3ForCausalLM's:
its fused `qkv_proj` and `gate_up_proj`, rows [gate; up] from each rank's `mlp.fc` rows [up; gate]).

A checkpoint is `config.json` + one `rank{N}.safetensors` per rank, N = tp_rank + pp_rank * tp_size
(NVIDIA/TensorRT-LLM docs/source/architecture/checkpoint.md). This module undoes ModelOpt 0.47's sharding
(`postprocess._split_model_config_for_tp` and `_split_model_config_for_pp`) and its name map (`trtllm_convert_layout`). Pure torch + safetensors,
so tests and the verification stage can use it without importing ModelOpt.

Sharding rules undone here:
  * column-parallel (`attention.qkv`, `mlp.fc`, `mlp.gate`, `lm_head`, the vocab embedding): split on
    dim 0; rows of the embedding / lm_head are zero-padded up to a multiple of tp_size;
  * `attention.qkv` on each rank is [q_r; k_r; v_r], so naive concatenation over ranks is wrong; when
    tp_size > num_key_value_heads the KV heads are repeated (`layer_utils.dup_kv_weight`);
  * row-parallel (`attention.dense`, `mlp.proj`): weight split on dim 1, bias replicated;
  * norms replicated;
  * pipeline stages hold consecutive layers, numbered from 0 on every stage; the vocab embedding lives
    on the first stage, `ln_f` and `lm_head` on the last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from pipeline.errors import ArtifactError

# TRT-LLM module inside `transformer.layers.{i}.` -> HF module inside `model.layers.{i}.`
LAYER_NAME_MAP = {
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
    "input_layernorm": "input_layernorm",
    "post_layernorm": "post_attention_layernorm",
}
TOP_NAME_MAP = {
    "transformer.vocab_embedding": "model.embed_tokens",
    "transformer.ln_f": "model.norm",
    "lm_head": "lm_head",
}
_COLUMN = {"mlp.fc", "mlp.gate", "lm_head"}
_ROW = {"attention.dense", "mlp.proj"}
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAYER_RE = re.compile(r"transformer\.layers\.(\d+)\.(.+)")


def trtllm_to_hf_state_dict(ckpt_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Return (config.json as a dict, full unsharded state dict with HF Llama names)."""
    ckpt_dir = Path(ckpt_dir)
    config_path = ckpt_dir / "config.json"
    if not config_path.is_file():
        raise ArtifactError(f"TensorRT-LLM checkpoint {ckpt_dir} has no config.json")
    config: dict[str, Any] = json.loads(config_path.read_text())
    mapping = config.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size", tp * pp))
    if world != tp * pp:
        raise ArtifactError(f"{config_path}: mapping world_size {world} != tp_size {tp} * pp_size {pp}")
    num_layers = int(config["num_hidden_layers"])
    if num_layers % pp:
        raise ArtifactError(f"{config_path}: {num_layers} layers cannot be split into {pp} pipeline stages")

    ranks = []
    for rank in range(world):
        path = ckpt_dir / f"rank{rank}.safetensors"
        if not path.is_file():
            raise ArtifactError(f"TensorRT-LLM checkpoint {ckpt_dir} is missing {path.name} (world_size {world})")
        ranks.append(load_file(path))
    _check_unquantized(config, ranks)

    state: dict[str, torch.Tensor] = {}
    for pp_rank in range(pp):
        shards = [ranks[tp_rank + pp_rank * tp] for tp_rank in range(tp)]
        names = set(shards[0])
        if any(set(s) != names for s in shards):
            raise ArtifactError(f"{ckpt_dir}: TP ranks of pipeline stage {pp_rank} hold different tensor names")
        for name in sorted(names):
            module, _, kind = name.rpartition(".")
            parts = [s[name] for s in shards]
            match = _LAYER_RE.fullmatch(module)
            if match is None:
                if module not in TOP_NAME_MAP:
                    raise ArtifactError(f"{ckpt_dir}: unexpected tensor {name!r}")
                state[f"{TOP_NAME_MAP[module]}.{kind}"] = _merge_top(module, parts, config)
                continue
            layer = pp_rank * (num_layers // pp) + int(match[1])
            sub = match[2]
            if sub == "attention.qkv":
                for proj, tensor in zip(("q", "k", "v"), _merge_qkv(parts, config)):
                    state[f"model.layers.{layer}.self_attn.{proj}_proj.{kind}"] = tensor
            elif sub == "mlp.fc" and config.get("architecture") == "Phi3ForCausalLM":
                state[f"model.layers.{layer}.mlp.gate_up_proj.{kind}"] = _merge_up_gate(parts)
            elif sub in LAYER_NAME_MAP:
                state[f"model.layers.{layer}.{LAYER_NAME_MAP[sub]}.{kind}"] = _merge(sub, kind, parts)
            else:
                raise ArtifactError(f"{ckpt_dir}: unexpected tensor {name!r}")

    if config.get("architecture") == "Phi3ForCausalLM":
        _fuse_phi3(state, num_layers)
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # share_embedding_table
    return config, state


def _check_unquantized(config: dict[str, Any], ranks: list[dict[str, torch.Tensor]]) -> None:
    quant_algo = (config.get("quantization") or {}).get("quant_algo")
    for weights in ranks:
        for name, tensor in weights.items():
            if not name.endswith((".weight", ".bias")) or tensor.dtype not in _FLOAT_DTYPES:
                raise ArtifactError(f"cannot read tensor {name!r} ({tensor.dtype}): only unquantized checkpoints are supported (quant_algo={quant_algo})")


def _merge(sub: str, kind: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    if sub in _COLUMN:
        return torch.cat(parts, dim=0)
    if sub in _ROW and kind == "weight":
        return torch.cat(parts, dim=1)
    return _replicated(sub, parts)  # norms, row-parallel biases


def _merge_top(module: str, parts: list[torch.Tensor], config: dict[str, Any]) -> torch.Tensor:
    if module == "transformer.ln_f" or len(parts) == 1:
        merged = _replicated(module, parts)
    elif module == "lm_head":
        merged = torch.cat(parts, dim=0)
    elif not config.get("use_parallel_embedding", False):
        merged = _replicated(module, parts)
    else:
        merged = torch.cat(parts, dim=int(config.get("embedding_sharding_dim", 0)))
    if module != "transformer.ln_f":
        merged = merged[: int(config["vocab_size"])].contiguous()  # drop TP padding rows
    return merged


def _replicated(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if any(not torch.equal(p, parts[0]) for p in parts[1:]):
        raise ArtifactError(f"{name} should be identical on every TP rank but is not")
    return parts[0]


def _merge_qkv(parts: list[torch.Tensor], config: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    tp = len(parts)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_size = int(config.get("head_size") or int(config["hidden_size"]) // heads)
    if heads % tp or (kv_heads % tp and tp % kv_heads):
        raise ArtifactError(f"{heads} heads / {kv_heads} KV heads cannot be split into {tp} TP ranks")
    q_rows = heads // tp * head_size
    kv_rows = max(kv_heads // tp, 1) * head_size
    split = [p.split([q_rows, kv_rows, kv_rows], dim=0) for p in parts if p.shape[0] == q_rows + 2 * kv_rows]
    if len(split) != tp:
        shapes = [tuple(p.shape) for p in parts]
        raise ArtifactError(f"attention.qkv shards {shapes} do not match q {q_rows} + k/v {kv_rows} rows per rank")
    q, k, v = (torch.cat([s[i] for s in split], dim=0) for i in range(3))
    if tp > kv_heads:  # every KV head was repeated tp // kv_heads times; keep one copy
        reps = tp // kv_heads
        k, v = (t.unflatten(0, (kv_heads, reps, head_size))[:, 0].flatten(0, 1) for t in (k, v))
    return q.contiguous(), k.contiguous(), v.contiguous()


def _merge_up_gate(parts: list[torch.Tensor]) -> torch.Tensor:
    """HF's gate_up_proj rows [gate; up] from Phi-3's `mlp.fc` shards, each rows [up_r; gate_r]."""
    halves = [p.chunk(2, dim=0) for p in parts]
    return torch.cat([h[1] for h in halves] + [h[0] for h in halves], dim=0).contiguous()


def _fuse_phi3(state: dict[str, torch.Tensor], num_layers: int) -> None:
    """Phi-3's Hugging Face attention holds q, k and v in one qkv_proj."""
    for layer in range(num_layers):
        prefix = f"model.layers.{layer}.self_attn"
        for kind in ("weight", "bias"):
            names = [f"{prefix}.{p}_proj.{kind}" for p in "qkv"]
            if all(n in state for n in names):
                state[f"{prefix}.qkv_proj.{kind}"] = torch.cat([state.pop(n) for n in names], dim=0)

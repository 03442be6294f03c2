"""Checks of a checkpoint's config.json against its weights, from the safetensors headers alone (no tensor is read).

What a wrong config does silently downstream: a `head_dim` that disagrees with the attention weights builds an
engine that reads the wrong rows; a MoE checkpoint missing an expert's tensors fails deep inside the export.

The header is read here (8 bytes of little-endian length, then that much JSON: the safetensors format) rather
than through the safetensors library, whose import pulls numpy into `validate`, a command kept light.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from pipeline.config.model_info import ModelInfo

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
# Per-expert tensor names: Mixtral's block_sparse_moe.experts.{i}.w1, Qwen/DeepSeek's mlp.experts.{i}.gate_proj.
_EXPERT = re.compile(r"experts\.(\d+)\.")
# The query projection of one layer: separate (q_proj) or fused with k and v (Phi-3's qkv_proj).
_QUERY = re.compile(r"self_attn\.(q_proj|qkv_proj)\.weight$")
# transformers 5's fused experts: one 3-D tensor per layer, experts on dim 0.
_FUSED_EXPERTS = re.compile(r"experts\.(gate_up_proj|down_proj)$")


_MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
# 4-bit codes packed into bytes or words: ModelOpt INT4 AWQ / W4A8 weights are U8 [out / 2, in], NVFP4 U8 [out, in / 2],
# GPTQ / compressed-tensors I32 [in / 8, out] or [out, in / 8]; their scales are checked against them instead
# (pipeline.config.prequantized_tensors)
_PACKED_DTYPES = frozenset({"U8", "I32"})


class WeightHeaderError(ValueError):
    """A safetensors file whose header cannot be read."""


def weight_shapes(info: ModelInfo, *, logical_only: bool = False) -> dict[str, list[int]]:
    """Every tensor's shape, by name, over the checkpoint's safetensors files (headers only). `logical_only`: leave out
    the packed integer tensors (`_PACKED_DTYPES`), whose shape is not the layer's."""
    shapes: dict[str, list[int]] = {}
    for name in info.weight_files:
        for key, entry in safetensors_header(Path(info.path) / name).items():
            if key != "__metadata__" and isinstance(entry, dict) and isinstance(entry.get("shape"), list):
                if not (logical_only and entry.get("dtype") in _PACKED_DTYPES):
                    shapes[key] = entry["shape"]
    return shapes


def safetensors_header(path: Path) -> dict:
    """The JSON header of one safetensors file (tensor name -> dtype, shape, offsets; and __metadata__)."""
    with path.open("rb") as handle:
        size_bytes = handle.read(8)
        if len(size_bytes) != 8:
            raise WeightHeaderError(f"{path}: shorter than a safetensors header")
        (size,) = struct.unpack("<Q", size_bytes)
        if size > _MAX_HEADER_BYTES:
            raise WeightHeaderError(f"{path}: header length {size} is not plausible (not a safetensors file)")
        try:
            header = json.loads(handle.read(size))
        except ValueError as exc:
            raise WeightHeaderError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WeightHeaderError(f"{path}: the safetensors header is not a JSON object")
    return header


def weight_issues(info: ModelInfo, shapes: dict[str, list[int]]) -> list[str]:
    """What the weights contradict in config.json, each message naming the file, key, value and tensor."""
    config_file = Path(info.path) / "config.json"
    issues: list[str] = []
    by_layer: dict[int, dict[str, list[int]]] = {}
    for name, shape in shapes.items():
        match = _LAYER.search(name)
        if match and name.startswith(("model.", "language_model.", "model.language_model.")):
            by_layer.setdefault(int(match.group(1)), {})[match.group(2)] = shape
    first = by_layer.get(0, {})
    issues += _head_dim_issues(info, first, config_file)
    issues += _expert_issues(info, by_layer, config_file)
    return issues


def _head_dim_issues(info: ModelInfo, layer: dict[str, list[int]], config_file: Path) -> list[str]:
    for name, shape in layer.items():
        match = _QUERY.search(name)
        if not match or len(shape) != 2 or info.mla is not None:
            continue
        rows = shape[0]
        expected = info.num_heads * info.head_dim
        if match.group(1) == "qkv_proj":
            expected += 2 * info.num_kv_heads * info.head_dim
        if rows != expected:
            key = f"head_dim {info.head_size}" if info.head_size is not None else f"hidden_size ÷ num_attention_heads = {info.head_dim}"
            return [
                f"{config_file}: {key} disagrees with the weights: layer 0's {name} has {rows} rows, "
                f"{info.num_heads} heads × {info.head_dim} would give {expected}"
            ]
    return []


def _expert_issues(info: ModelInfo, by_layer: dict[int, dict[str, list[int]]], config_file: Path) -> list[str]:
    moe = info.moe
    if moe is None:
        return []
    for index in sorted(by_layer):
        layer = by_layer[index]
        fused = [(name, shape) for name, shape in layer.items() if _FUSED_EXPERTS.search(name)]
        for name, shape in fused:
            if shape and shape[0] != moe.num_experts:
                return [f"{config_file}: {moe.source_key} is {moe.num_experts}, but layer {index}'s {name} holds {shape[0]} experts"]
        per_pattern: dict[str, set[int]] = {}
        for name in layer:
            match = _EXPERT.search(name)
            if match:
                per_pattern.setdefault(_EXPERT.sub("experts.N.", name, count=1), set()).add(int(match.group(1)))
        for pattern, experts in sorted(per_pattern.items()):
            if experts == set(range(moe.num_experts)):
                continue
            missing = sorted(set(range(moe.num_experts)) - experts)
            if not missing:
                return [f"{config_file}: {moe.source_key} is {moe.num_experts}, but layer {index} has tensors of expert {max(experts)}"]
            tensor = pattern.replace("experts.N.", f"experts.{missing[0]}.")
            return [
                f"{config_file}: {moe.source_key} is {moe.num_experts}, but the checkpoint lacks layer {index}'s "
                f"{tensor}" + (f" (and {len(missing) - 1} more experts)" if len(missing) > 1 else "")
            ]
    return []


def read_json_object(path: Path) -> tuple[dict, str | None]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {}, f"cannot read {path} ({type(exc).__name__}: {exc})"
    if not isinstance(config, dict):
        return {}, f"{path} is not a JSON object"
    return config, None

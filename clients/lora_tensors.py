"""A Hugging Face PEFT LoRA adapter as NVIDIA's `lora_weights` / `lora_config` request tensors. numpy + safetensors only.

The layout is TensorRT-LLM's `examples/hf_lora_convert.py` (what `inflight_batcher_llm_client.py --lora-path` reads, and
what the C++ LoRA cache copies: `runtime/loraCache.cpp` `copyToPages`):

- one row per (LoRA module, layer); `lora_config` [1, rows, 3] int32, each row [module_id, layer, rank] with
  TensorRT-LLM's module ids (`LoraManager.LORA_MODULE_IDS`);
- `lora_weights` [1, rows, max_row] (float16 by default, the Triton contract's FP16): each row is the module's
  lora_A [rank, in] flattened, then its lora_B [out, rank] times the adapter's scale (lora_alpha / r, or / √r with
  use_rslora) flattened, then zeros up to the longest row;
- PEFT module names map to modules as the script's table does (q_proj → attn_q, ..., gate_proj → mlp_h_to_4h,
  up_proj → mlp_gate, qkv_proj → attn_qkv, gate_up_proj → mlp_h_to_4h with lora_B's two halves swapped: TensorRT-LLM's
  fused MLP input is [up; gate], HF's gate_up_proj [gate; up]);
- written as `model.lora_weights.npy` / `model.lora_config.npy` (the leading axis of 1 is the request's batch).

Where this differs from the script, it refuses what the script would convert wrongly or drop without a word: pickled
weights (adapter_model.bin) are never loaded; modules the table does not know (MoE experts, embeddings), DoRA,
per-module rank_pattern / alpha_pattern and modules_to_save are errors naming them. Rows are ordered by layer, then
module id (the script follows the file's key order; each row names its module and layer, so order does not matter to
the engine). The script guesses which axis of A / B is the rank ("the hidden dim is the larger"); PEFT stores them as
A [r, in], B [out, r], which is read as such. The scale is applied in float32, then the row is rounded to the dtype.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from clients.errors import ClientError

ADAPTER_CONFIG, ADAPTER_WEIGHTS, PICKLED_WEIGHTS = "adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"
WEIGHTS_FILE, CONFIG_FILE, LEGACY_CONFIG_FILE = "model.lora_weights.npy", "model.lora_config.npy", "model.lora_keys.npy"
DTYPES = {"float16": np.float16, "float32": np.float32}

# TensorRT-LLM's module ids of the modules the script writes (tensorrt_llm/lora_manager.py)
LORA_MODULE_IDS = MappingProxyType({"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5, "mlp_4h_to_h": 6, "mlp_gate": 7})
# PEFT (Hugging Face) module name -> TensorRT-LLM module: examples/hf_lora_convert.py's hf_modules_to_trtllm_modules
HF_MODULES = MappingProxyType(
    {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "qkv_proj": "attn_qkv",
        "query_key_value": "attn_qkv",
        "o_proj": "attn_dense",
        "dense": "attn_dense",
        "gate_proj": "mlp_h_to_4h",
        "down_proj": "mlp_4h_to_h",
        "up_proj": "mlp_gate",
        "gate_up_proj": "mlp_h_to_4h",
        "c_fc": "mlp_h_to_4h",
        "c_proj": "mlp_4h_to_h",
    }
)
_SWAPPED_HALVES = ("gate_up_proj",)
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter name may follow lora_A)
_LORA_KEY = re.compile(r"(?:^|.*\.)layers\.(\d+)\.(?:.*\.)?(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


class LoraAdapterError(ClientError, ValueError):
    """A PEFT adapter directory that cannot be converted; the message names the file, key or field."""


@dataclass(frozen=True)
class LoraTensors:
    weights: NDArray[Any]  # [1, rows, max_row], float16 or float32
    config: NDArray[Any]  # [1, rows, 3] int32: module_id, layer, rank


def convert_peft_adapter(adapter_dir: Path | str, dtype: str = "float16") -> LoraTensors:
    """The adapter in `adapter_dir` (adapter_config.json + adapter_model.safetensors) as NVIDIA's request tensors."""
    adapter_dir = Path(adapter_dir)
    if dtype not in DTYPES:
        raise LoraAdapterError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)} (numpy has no bfloat16)")
    config = _adapter_config(adapter_dir)
    rank, scale = config["r"], _scale(config)
    rows: list[tuple[int, int, int, NDArray[Any]]] = []
    for (layer, module), (a, b) in sorted(_lora_pairs(adapter_dir / ADAPTER_WEIGHTS).items()):
        where = f"{ADAPTER_WEIGHTS}: layer {layer} {module}"
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise LoraAdapterError(
                f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not [r, in] and [out, r] with r = {rank} ({ADAPTER_CONFIG})"
            )
        if module in _SWAPPED_HALVES:
            half = b.shape[0] // 2
            b = np.concatenate((b[half:], b[:half]))
        row = np.concatenate((a.reshape(-1), (b * np.float32(scale)).reshape(-1))).astype(DTYPES[dtype])
        rows.append((LORA_MODULE_IDS[HF_MODULES[module]], layer, rank, row))
    rows.sort(key=lambda row: (row[1], row[0]))
    width = max(len(row[3]) for row in rows)
    weights = np.zeros((1, len(rows), width), dtype=DTYPES[dtype])
    for index, (_, _, _, row) in enumerate(rows):
        weights[0, index, : len(row)] = row
    return LoraTensors(weights, np.array([[[m, layer, r] for m, layer, r, _ in rows]], dtype=np.int32))


def write_lora_tensors(tensors: LoraTensors, out_dir: Path | str) -> tuple[Path, Path]:
    """`model.lora_weights.npy` and `model.lora_config.npy` in `out_dir` (created), as NVIDIA's script names them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / WEIGHTS_FILE, tensors.weights)
    np.save(out_dir / CONFIG_FILE, tensors.config)
    return out_dir / WEIGHTS_FILE, out_dir / CONFIG_FILE


def read_lora_tensors(directory: Path | str) -> LoraTensors:
    """The tensors of a converted adapter directory (`model.lora_config.npy`, or the older `model.lora_keys.npy`, as
    NVIDIA's client reads them); never unpickles."""
    directory = Path(directory)
    config_file = directory / CONFIG_FILE if (directory / CONFIG_FILE).is_file() else directory / LEGACY_CONFIG_FILE
    try:
        return LoraTensors(np.load(directory / WEIGHTS_FILE, allow_pickle=False), np.load(config_file, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise LoraAdapterError(f"{directory}: not a converted LoRA adapter ({WEIGHTS_FILE} and {CONFIG_FILE}): {exc}") from None


def _adapter_config(adapter_dir: Path) -> dict[str, Any]:
    config_file = adapter_dir / ADAPTER_CONFIG
    if not config_file.is_file():
        raise LoraAdapterError(f"{adapter_dir}: no {ADAPTER_CONFIG}; not a Hugging Face PEFT adapter directory")
    if not (adapter_dir / ADAPTER_WEIGHTS).is_file():
        if (adapter_dir / PICKLED_WEIGHTS).is_file():
            raise LoraAdapterError(
                f"{adapter_dir / PICKLED_WEIGHTS}: pickled weights are never loaded (unpickling runs code); save the "
                f"adapter as {ADAPTER_WEIGHTS} (PEFT's save_pretrained does by default)"
            )
        raise LoraAdapterError(f"{adapter_dir}: no {ADAPTER_WEIGHTS}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoraAdapterError(f"{config_file}: unreadable ({exc})") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraAdapterError(f"{config_file}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    refused = {
        "use_dora": "DoRA adapters",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "modules_to_save": "fully trained modules (modules_to_save)",
    }
    for key, what in refused.items():
        if config.get(key):
            raise LoraAdapterError(f"{config_file}: {key} is set; {what} have no place in TensorRT-LLM's lora_weights / lora_config")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraAdapterError(f"{config_file}: r (the rank) must be a positive integer, got {rank!r}")
    return config


def _scale(config: dict[str, Any]) -> float:
    alpha = config.get("lora_alpha", 8)  # PEFT's default
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoraAdapterError(f"{ADAPTER_CONFIG}: lora_alpha must be a number, got {alpha!r}")
    return alpha / math.sqrt(config["r"]) if config.get("use_rslora") else alpha / config["r"]


def _lora_pairs(path: Path) -> dict[tuple[int, str], tuple[NDArray[Any], NDArray[Any]]]:
    """(layer, PEFT module) -> (lora_A, lora_B) as float32."""
    halves: dict[tuple[int, str], dict[str, NDArray[Any]]] = {}
    for key, value in _read_safetensors(path).items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise LoraAdapterError(f"{path.name}: tensor {key} is not a decoder layer's lora_A / lora_B weight; TensorRT-LLM's lora_weights hold nothing else")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in HF_MODULES:
            raise LoraAdapterError(f"{path.name}: tensor {key}: module {module} has no TensorRT-LLM LoRA module (known: {', '.join(HF_MODULES)})")
        halves.setdefault((layer, module), {})[half] = value
    pairs = {}
    for (layer, module), found in halves.items():
        if set(found) != {"A", "B"}:
            raise LoraAdapterError(f"{path.name}: layer {layer} {module} has lora_{''.join(found)} without its other half")
        pairs[(layer, module)] = (found["A"], found["B"])
    if not pairs:
        raise LoraAdapterError(f"{path.name}: holds no lora_A / lora_B weights")
    return pairs


def _read_safetensors(path: Path) -> dict[str, NDArray[Any]]:
    """Every tensor as float32. safetensors' numpy loader has no bfloat16 (numpy lacks the type), so BF16 tensors are read
    from their bytes: the file is an 8-byte little-endian header length, a JSON header ({name: {dtype, shape,
    data_offsets}}), then the data; a bfloat16 is the upper half of a float32."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, NDArray[Any]] = {}
    bfloat16: list[str] = []
    try:
        with safe_open(str(path), framework="numpy") as handle:
            for key in handle.keys():
                try:
                    tensors[key] = handle.get_tensor(key).astype(np.float32)
                except TypeError:
                    bfloat16.append(key)
    except (OSError, SafetensorError) as exc:
        raise LoraAdapterError(f"{path}: unreadable safetensors file ({exc})") from None
    if bfloat16:
        raw = path.read_bytes()
        (header_len,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + header_len])
        for key in bfloat16:
            entry = header[key]
            if entry["dtype"] != "BF16":
                raise LoraAdapterError(f"{path.name}: tensor {key} has dtype {entry['dtype']}, not a floating-point type")
            start, end = (8 + header_len + offset for offset in entry["data_offsets"])
            bits = np.frombuffer(raw[start:end], dtype="<u2").astype(np.uint32) << 16
            tensors[key] = bits.view(np.float32).reshape(entry["shape"])
    return tensors

"""The TensorRT-LLM checkpoint of a Medusa model: the base checkpoint the quantize stage wrote, plus the heads under
their TensorRT-LLM names, and the config keys of MedusaForCausalLM (what examples/medusa/convert_checkpoint.py and
quantization/quantize.py's combine step write; tensorrt_llm/models/medusa/{config,weight}.py read it):

  * every rank (every pipeline stage too: MedusaForCausalLm builds the heads on each) gets every head, tensor-parallel
    split like the base's column-parallel Linears: per head h and residual layer l,
    `medusa_heads.{h}.medusa_layers.{l}.linear.weight` [H/tp, H] and `.bias` [H/tp] (rows of the heads'
    `{h}.{l}.linear.*`), and `medusa_heads.{h}.lm_head.weight` [V'/tp, H] (rows of `{h}.{L}.weight`, zero-padded to
    V' = pad_vocab_size(vocab_size, tp), the rows tensorrt_llm/models/medusa/model.py gives each head's lm_head);
  * the heads are written in the checkpoint's dtype and, on a quantized base, excluded from its quantization
    (`*medusa_heads*` in exclude_modules: NVIDIA's default, --quant_medusa_head off). A base quantization without
    exclude_modules relies on quantize()'s default list (tensorrt_llm/quantization/quantize.py, quantize_layers: None
    means lm_head, router and embeddings excluded), which the heads' pattern then extends rather than replaces;
  * config.json: architecture MedusaForCausalLM, num_medusa_heads, num_medusa_layers, max_draft_len (the tree's nodes
    or the build's bound), model_type of the base (MedusaConfig wraps LLaMAConfig, or QWenConfig for qwen types).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.config.spec.speculative_heads import MEDUSA_CONFIG_FILE, MEDUSA_HEADS_FILE
from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.convert import read_json

__all__ = ["MEDUSA_ARCHITECTURE", "copy_side_files", "read_base_checkpoint", "write_medusa_checkpoint"]

MEDUSA_ARCHITECTURE = "MedusaForCausalLM"
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_EXCLUDED_HEADS = "*medusa_heads*"
# quantize_layers' exclusions when the quantization names none (tensorrt_llm/quantization/quantize.py, TensorRT-LLM 1.2)
_NVIDIA_DEFAULT_EXCLUDES = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding", "*shared_expert_gate")


def write_medusa_checkpoint(base_dir: Path, heads_dir: Path, out_dir: Path, *, max_draft_len: int) -> dict[str, Any]:
    """Write base + heads into `out_dir` (a new directory); return its config.json."""
    config, dtype, tp, pp = read_base_checkpoint(base_dir)
    heads_config = read_json(heads_dir / MEDUSA_CONFIG_FILE, None)
    num_heads, num_layers = int(heads_config["medusa_num_heads"]), int(heads_config["medusa_num_layers"])
    heads = load_file(str(heads_dir / MEDUSA_HEADS_FILE))
    out_dir.mkdir(parents=True, exist_ok=False)
    for rank in range(tp * pp):
        base = load_file(str(base_dir / f"rank{rank}.safetensors"))
        base.update(_rank_heads(heads, num_heads, num_layers, tp, rank % tp, _padded_vocab(config, tp), dtype))
        save_file(base, str(out_dir / f"rank{rank}.safetensors"))
    copy_side_files(base_dir, out_dir)
    config = _medusa_config(config, num_heads, num_layers, max_draft_len)
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    return config


def read_base_checkpoint(base_dir: Path) -> tuple[dict[str, Any], torch.dtype, int, int]:
    """The base TensorRT-LLM checkpoint's config.json, its dtype, tp_size and pp_size."""
    config = read_json(base_dir / "config.json", None)
    dtype = _DTYPES.get(config.get("dtype", ""))
    if dtype is None:
        raise StageError(f"{base_dir / 'config.json'}: dtype {config.get('dtype')!r} is not one of {', '.join(_DTYPES)}")
    mapping = config.get("mapping") or {}
    return config, dtype, int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))


def copy_side_files(base_dir: Path, out_dir: Path) -> None:
    """Copy what the base checkpoint holds besides config.json and its ranks (a LoRA or quantization side file)."""
    for extra in sorted(base_dir.iterdir()):
        if extra.is_file() and extra.name != "config.json" and not extra.name.startswith("rank"):
            shutil.copyfile(extra, out_dir / extra.name)


def _medusa_config(config: dict[str, Any], num_heads: int, num_layers: int, max_draft_len: int) -> dict[str, Any]:
    base_architecture = config.get("architecture")
    model_type = _MODEL_TYPES.get(str(base_architecture))
    if model_type is None:
        raise StageError(
            f"the checkpoint's architecture {base_architecture} has no Medusa form in TensorRT-LLM (MedusaForCausalLM wraps {', '.join(_MODEL_TYPES)})"
        )
    quantization = dict(config.get("quantization") or {})
    if quantization.get("quant_algo") is not None:
        listed = quantization.get("exclude_modules")
        excluded = list(_NVIDIA_DEFAULT_EXCLUDES if listed is None else listed)
        quantization["exclude_modules"] = excluded + ([_EXCLUDED_HEADS] if _EXCLUDED_HEADS not in excluded else [])
    return {
        **config,
        "architecture": MEDUSA_ARCHITECTURE,
        "model_type": config.get("model_type", model_type),
        **({"qwen_type": model_type} if model_type == "qwen2" else {}),
        "quantization": quantization,
        "num_medusa_heads": num_heads,
        "num_medusa_layers": num_layers,
        "max_draft_len": max_draft_len,
    }


def _padded_vocab(config: dict[str, Any], tp: int) -> int:
    """pad_vocab_size(vocab_size, tp): the rows MedusaHead's lm_head spans over all TP ranks, on every stage."""
    return math.ceil(int(config["vocab_size"]) / tp) * tp


def _rank_heads(
    heads: dict[str, torch.Tensor], num_heads: int, num_layers: int, tp: int, tp_rank: int, padded_vocab: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            prefix = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            out[f"{prefix}.weight"] = _rows(_tensor(heads, f"{h}.{layer}.linear.weight"), tp, tp_rank, dtype)
            out[f"{prefix}.bias"] = _rows(_tensor(heads, f"{h}.{layer}.linear.bias"), tp, tp_rank, dtype)
        lm_head = _tensor(heads, f"{h}.{num_layers}.weight")
        if lm_head.shape[0] < padded_vocab:
            lm_head = torch.cat([lm_head, lm_head.new_zeros(padded_vocab - lm_head.shape[0], lm_head.shape[1])])
        out[f"medusa_heads.{h}.lm_head.weight"] = _rows(lm_head, tp, tp_rank, dtype)
    return out


def _tensor(heads: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in heads:
        raise StageError(f"build.speculative.medusa.heads: {MEDUSA_HEADS_FILE} has no tensor {key}")
    return heads[key]


def _rows(tensor: torch.Tensor, tp: int, tp_rank: int, dtype: torch.dtype) -> torch.Tensor:
    if tensor.shape[0] % tp:
        raise StageError(f"a Medusa head tensor of {tensor.shape[0]} rows does not split over tp_size {tp}")
    return tensor.chunk(tp, dim=0)[tp_rank].to(dtype).contiguous()


def command(base_dir: Path, heads_dir: Path, out_dir: Path, max_draft_len: int) -> list[str]:
    """This writer as a command (a GPU host's dry run: run it after the quantize job, before trtllm-build)."""
    return ["python3", "-m", __name__, str(base_dir), str(heads_dir), str(out_dir), "--max-draft-len", str(max_draft_len)]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python3 -m {__name__}", description="write the TensorRT-LLM checkpoint of a Medusa model")
    parser.add_argument("base_dir", type=Path, help="the base model's TensorRT-LLM checkpoint")
    parser.add_argument("heads_dir", type=Path, help="the Medusa heads (medusa_lm_head.safetensors + config.json)")
    parser.add_argument("out_dir", type=Path, help="the Medusa checkpoint to write (a new directory)")
    parser.add_argument("--max-draft-len", type=int, required=True, help="the tree's nodes (trtllm-build --max_draft_len)")
    args = parser.parse_args(argv)
    try:
        write_medusa_checkpoint(args.base_dir, args.heads_dir, args.out_dir, max_draft_len=args.max_draft_len)
    except StageError as exc:
        print(f"medusa checkpoint: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

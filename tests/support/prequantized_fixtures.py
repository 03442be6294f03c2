"""Pre-quantized checkpoints of one tiny Qwen2, in each format `validate` detects (pipeline.config.prequantized).

ModelOpt's formats are written by ModelOpt itself (`modelopt_export`: calibration and the unified export of
pipeline.quantization, as the quantize stage writes them). compressed-tensors, llm-compressor, AutoAWQ, GPTQModel
and DeepSeek's or GPT-OSS's own writers are not installed here, so those checkpoints are written from their published
layouts (`from_spec`): the config.json `quantization_config` each library writes and, per linear layer, its tensor
names, dtypes and shapes (the sources are cited in pipeline/config/prequantized.py and prequantized_tensors.py).
Their codes are random (validate reads headers and scale values, never the codes); their scales are positive.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

VOCAB, HIDDEN, INTER, LAYERS = 256, 128, 256, 2
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

Layer = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]


def tiny_qwen2(directory: Path) -> Path:
    """A seeded random Qwen2 (fp16 safetensors, config.json), no tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        architectures=["Qwen2ForCausalLM"],
    )
    Qwen2ForCausalLM(config).to(torch.float16).save_pretrained(directory)
    return directory


def modelopt_export(base: Path, algo: str, directory: Path, *, kv_cache: str = "none", group_size: int = 64) -> Path:
    """`base` calibrated with ModelOpt's recipe for quantize.algo `algo` on two random batches, then its unified export."""
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    from pipeline.quantization.modelopt_export import QuantRecipe, _mtq_config
    from pipeline.quantization.unified_export import export_unified_checkpoint

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (2, 32), generator=generator) for _ in range(2)]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        model = mtq.quantize(model, _mtq_config(QuantRecipe(algo, kv_cache, group_size)), lambda m: [m(b) for b in batches])
        export_unified_checkpoint(model, directory, dtype=torch.float16)
    return directory


def from_spec(base: Path, directory: Path, quantization_config: dict[str, Any], layer: Layer, *, skip: tuple[str, ...] = ()) -> Path:
    """`base` with every decoder linear weight replaced by `layer(name, weight)`'s tensors and config.json's
    quantization_config set; the names in `skip` are left out (a checkpoint missing tensors)."""
    directory.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(base / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in _LINEAR:
            tensors.update(layer(module, tensor))
        else:
            tensors[name] = tensor
    save_file({k: v.contiguous() for k, v in tensors.items() if k not in skip}, str(directory / "model.safetensors"))
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("generation_config.json",):
        if (base / extra).is_file():
            shutil.copy(base / extra, directory / extra)
    return directory


def _codes(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randint(0, 127, shape, dtype=torch.int32).to(dtype)


def _scales(*shape: int) -> torch.Tensor:
    return torch.rand(shape, dtype=torch.float32) * 0.01 + 1e-3


def fp8_per_tensor(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors `float-quantized` / HF `fp8`, one scale per tensor, static input scale."""
    return {f"{module}.weight": w.float().to(torch.float8_e4m3fn), f"{module}.weight_scale": _scales(1), f"{module}.input_scale": _scales(1)}


def fp8_block(block: int, suffix: str = "weight_scale_inv") -> Layer:
    """DeepSeek-V3 FP8 blocks: weight F8_E4M3, `weight_scale_inv` [ceil(out / b), ceil(in / b)] (float32)."""

    def layer(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        out, inp = w.shape
        return {f"{module}.weight": w.float().to(torch.float8_e4m3fn), f"{module}.{suffix}": _scales(-(-out // block), -(-inp // block))}

    return layer


def w4a16_packed(group: int) -> Layer:
    """compressed-tensors `pack-quantized`: weight_packed I32 [out, in / 8], weight_scale [out, in / group], weight_shape."""

    def layer(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        out, inp = w.shape
        return {
            f"{module}.weight_packed": _codes((out, inp // 8), torch.int32),
            f"{module}.weight_scale": _scales(out, inp // group).half(),
            f"{module}.weight_shape": torch.tensor([out, inp], dtype=torch.int64),
        }

    return layer


def autoawq(group: int) -> Layer:
    """AutoAWQ GEMM: qweight I32 [in, out / 8], qzeros I32 [in / group, out / 8], scales F16 [in / group, out]."""

    def layer(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        out, inp = w.shape
        return {
            f"{module}.qweight": _codes((inp, out // 8), torch.int32),
            f"{module}.qzeros": _codes((inp // group, out // 8), torch.int32),
            f"{module}.scales": _scales(inp // group, out).half(),
        }

    return layer


def gptq(group: int, *, desc_act: bool = False) -> Layer:
    """GPTQ 4-bit: qweight I32 [in / 8, out], qzeros I32 [in / group, out / 8], scales F16 [in / group, out], g_idx [in]."""

    def layer(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        out, inp = w.shape
        g_idx = torch.arange(inp, dtype=torch.int32) // group
        return {
            f"{module}.qweight": _codes((inp // 8, out), torch.int32),
            f"{module}.qzeros": _codes((inp // group, out // 8), torch.int32),
            f"{module}.scales": _scales(inp // group, out).half(),
            f"{module}.g_idx": g_idx[torch.randperm(inp)] if desc_act else g_idx,
        }

    return layer


def mxfp4(module: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPT-OSS MXFP4 (there on the experts; here on every linear): `<name>_blocks` U8 [out, in / 32, 16] and
    `<name>_scales` U8 [out, in / 32] (E8M0 exponents)."""
    out, inp = w.shape
    return {f"{module}.weight_blocks": _codes((out, inp // 32, 16), torch.uint8), f"{module}.weight_scales": _codes((out, inp // 32), torch.uint8) + 120}


CT_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
        }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
}
CT_W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True, "dynamic": False},
            "input_activations": None,
        }
    },
    "ignore": ["lm_head"],
}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True, "checkpoint_format": "gptq"}
DEEPSEEK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [64, 64]}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}

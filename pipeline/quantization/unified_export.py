"""ModelOpt's unified Hugging Face export of a calibrated model, with the INT8 KV-cache scales it cannot write.

`export_hf_checkpoint` (ModelOpt 0.47) refuses a model whose K/V quantizers are INT8: `postprocess_state_dict`
asserts the KV format is FP8 or NVFP4 (`quant_utils.py`, "Invalid KV cache quantization format."). TensorRT-LLM's
engine path runs an INT8 KV cache, so for that case the K/V quantizers are taken out of the export and their scales
(amax / 127, what ModelOpt's TensorRT-LLM export wrote as k/v_cache_scaling_factor) are written next to the
weights under the unified names (`<attention>.k_proj.k_scale`, `<attention>.v_proj.v_scale`), and
hf_quant_config.json says `kv_cache_quant_algo: INT8`. Only pipeline.quantization.trtllm_checkpoint.convert reads that case (the
PyTorch backend has no INT8 KV cache, quant_formats.KV_CACHE_FORMATS).

A model without quantizers (quantize.algo none or int8_wo, no KV quantization) is written with `save_pretrained`:
the unified checkpoint of an unquantized model is its Hugging Face checkpoint, and `export_hf_checkpoint` refuses
transformers 5's fused MoE experts that no quantizer wraps ("MoE model with experts type 'MixtralExperts' is not
supported in export"); `save_pretrained` writes them per expert under the hub's names.

ModelOpt is imported inside the function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["export_unified_checkpoint", "INT8_KV_SCALES_FILE"]

INT8_KV_SCALES_FILE = "kv_cache_scales.safetensors"
_KV_QUANTIZERS = {"k_bmm_quantizer": "k_proj.k_scale", "v_bmm_quantizer": "v_proj.v_scale"}


def export_unified_checkpoint(model: PreTrainedModel, export_dir: Path, *, dtype: torch.dtype) -> None:
    """`export_hf_checkpoint(model)` into `export_dir`, plus the INT8 KV-cache scales (see the module doc)."""
    from modelopt.torch.export import export_hf_checkpoint

    export_dir = Path(export_dir)
    if not _has_quantizers(model):
        if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
            # transformers types PreTrainedModel.to by functools.wraps(Module.to), which keeps Module.to's self argument
            model = model.to(dtype)  # type: ignore[arg-type]
        model.save_pretrained(export_dir, safe_serialization=True)
        return
    held = _int8_kv_quantizers(model)
    scales = {name: (quantizer.amax.float() / quantizer.maxbound).reshape(()) for name, quantizer in held.items()}
    amaxes = {name: quantizer.amax.clone() for name, quantizer in held.items()}
    for quantizer in held.values():
        quantizer.disable()
        quantizer.reset_amax()
    try:
        export_hf_checkpoint(model, dtype=dtype, export_dir=export_dir)
    finally:
        for name, quantizer in held.items():
            quantizer.amax = amaxes[name]
            quantizer.enable()
    if scales:
        save_file({name: scale.contiguous() for name, scale in scales.items()}, str(export_dir / INT8_KV_SCALES_FILE))
        _mark_int8_kv_cache(export_dir / "hf_quant_config.json")


def _has_quantizers(model: torch.nn.Module) -> bool:
    from modelopt.torch.quantization.nn import TensorQuantizer

    return any(isinstance(module, TensorQuantizer) for module in model.modules())


def _int8_kv_quantizers(model: torch.nn.Module) -> dict[str, Any]:
    """Unified tensor name of the scale -> the enabled INT8 K/V quantizer it comes from."""
    found = {}
    for module_name, module in model.named_modules():
        for attr, scale_name in _KV_QUANTIZERS.items():
            quantizer = getattr(module, attr, None)
            if quantizer is not None and quantizer.is_enabled and quantizer.num_bits == 8 and quantizer.amax is not None:
                found[f"{module_name}.{scale_name}"] = quantizer
    return found


def _mark_int8_kv_cache(path: Path) -> None:
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"quantization": {"quant_algo": None}}
    data["quantization"]["kv_cache_quant_algo"] = "INT8"
    path.write_text(json.dumps(data, indent=4) + "\n")

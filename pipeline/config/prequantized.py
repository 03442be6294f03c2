"""What a checkpoint declares about its own quantization, read from config.json and hf_quant_config.json.

A published checkpoint may hold quantized codes (float8_e4m3fn, packed INT4, MXFP4 blocks) next to their scales.
Read as plain weights those codes are garbage, so `validate` must know they are there. This module reads the
declarations only (no tensor, no torch); pipeline.config.prequantized_tensors checks them against the safetensors
headers, and pipeline.config.prequantized_targets says what each build.target does with them.

Where each declaration's layout comes from (public sources):
- ModelOpt's unified export: `hf_quant_config.json` `{"producer": {"name": "modelopt"}, "quantization": {"quant_algo",
  "kv_cache_quant_algo", "group_size", "exclude_modules"}}`, moving into config.json's `quantization_config` with
  `quant_method: modelopt`; read first by TensorRT-LLM (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py
  @008e0af8, `load_modelopt_quant_config`, `load_hf_quant_config`) and by vLLM (vllm-project/vllm
  vllm/model_executor/layers/quantization/modelopt.py @c9a59901: FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4).
- compressed-tensors: `quant_method: compressed-tensors`, `format`, `config_groups.*.weights` / `input_activations`
  (`num_bits`, `type` int|float, `strategy` tensor|channel|group|block, `group_size`, `block_structure`),
  `ignore`, `kv_cache_scheme` (neuralmagic/compressed-tensors src/compressed_tensors/quantization/quant_args.py
  @f0b60789; vllm-project/vllm .../compressed_tensors/compressed_tensors.py @be696453).
- AutoAWQ `quant_method: awq` (`bits`, `group_size`, `zero_point`, `version`; vllm-project/vllm .../awq.py @92d756e9)
  and GPTQ `quant_method: gptq` (`bits`, `group_size`, `desc_act`, `sym`; .../gptq.py @e5dd90be).
- DeepSeek-V3's FP8 block scales: `quant_method: fp8`, `weight_block_size: [128, 128]`, `activation_scheme`
  (vllm-project/vllm .../fp8.py @1436674b; TensorRT-LLM's `load_hf_quant_config` maps it to FP8_BLOCK_SCALES).
- GPT-OSS `quant_method: mxfp4`, `modules_to_not_convert` (vllm-project/vllm .../mxfp4.py @afdb4a4f).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config.weight_checks import read_json_object

HF_QUANT_CONFIG = "hf_quant_config.json"

# ModelOpt's quant_algo names (TensorRT-LLM's QuantAlgo) -> (format id, label).
_MODELOPT_ALGOS: dict[str, tuple[str, str]] = {
    "FP8": ("modelopt_fp8", "ModelOpt FP8 (per-tensor scales)"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("modelopt_fp8_per_channel", "ModelOpt FP8 (per-channel weight scales, per-token activations)"),
    "FP8_PB_WO": ("modelopt_fp8_block", "ModelOpt FP8 block scales (weight-only)"),
    "FP8_BLOCK_SCALES": ("modelopt_fp8_block", "ModelOpt FP8 block scales"),
    "NVFP4": ("modelopt_nvfp4", "ModelOpt NVFP4"),
    "W4A16_AWQ": ("modelopt_int4_awq", "ModelOpt INT4 AWQ (W4A16)"),
    "W4A8_AWQ": ("modelopt_w4a8_awq", "ModelOpt W4A8 AWQ (INT4 weights, FP8 activations)"),
    "W8A8_SQ_PER_CHANNEL": ("modelopt_int8_sq", "ModelOpt INT8 SmoothQuant (W8A8)"),
    "W8A16": ("modelopt_int8_wo", "ModelOpt INT8 weight-only (W8A16)"),
    "W4A8_NVFP4_FP8": ("modelopt_w4a8_nvfp4_fp8", "ModelOpt W4A8 (NVFP4 weights, FP8 activations)"),
    "MIXED_PRECISION": ("modelopt_mixed", "ModelOpt mixed precision (per-layer formats in quant_cfg.json)"),
}
# The config.json quant_method values read here; anything else is refused by name.
KNOWN_METHODS = ("modelopt", "compressed-tensors", "awq", "gptq", "fp8", "mxfp4")


class PreQuantizedError(ValueError):
    """A quantization declaration this tool cannot read (unknown method or algo, malformed file)."""


@dataclass(frozen=True)
class PreQuantized:
    """One checkpoint's quantization, as declared (and later checked against the tensors)."""

    format: str  # a stable id, e.g. "modelopt_fp8", "gptq_int4" (the key of prequantized_targets' table)
    label: str  # what a person reads, e.g. "ModelOpt FP8 (per-tensor scales)"
    where: str  # the file and key it was found in
    group_size: int | None = None  # weights per scale along the input dimension (INT4 / NVFP4 / group strategies)
    block_size: tuple[int, int] | None = None  # (rows, columns) of one FP8 block scale
    kv_cache: str | None = None  # the KV-cache format it declares ("FP8", "INT8"), None: none declared
    excluded: tuple[str, ...] = ()  # modules kept unquantized (exclude_modules / ignore / modules_to_not_convert)
    details: tuple[tuple[str, str], ...] = ()  # further declared facts: desc_act, sym, zero_point, strategy, format

    def describe(self, *, source: bool = True) -> str:
        parts = [self.label]
        if self.group_size is not None:
            parts.append(f"group size {self.group_size}")
        if self.block_size is not None:
            parts.append(f"block {self.block_size[0]}×{self.block_size[1]}")
        parts += [f"{key} {value}" for key, value in self.details]
        parts.append(f"KV cache {self.kv_cache or 'not quantized'}")
        if self.excluded:
            shown = ", ".join(self.excluded[:4]) + (f", … ({len(self.excluded)} in all)" if len(self.excluded) > 4 else "")
            parts.append(f"kept unquantized: {shown}")
        return f"{', '.join(parts)} (from {self.where})" if source else ", ".join(parts)


def declared_quantization(path: Path, config: dict[str, Any]) -> PreQuantized | None:
    """The quantization `path` declares: hf_quant_config.json first (as TensorRT-LLM reads it), then config.json's
    quantization_config; None when neither declares one."""
    hf_file = path / HF_QUANT_CONFIG
    if hf_file.is_file():
        data, error = read_json_object(hf_file)
        if error is not None:
            raise PreQuantizedError(error)
        quantization = data.get("quantization", data)
        if not isinstance(quantization, dict):
            raise PreQuantizedError(f"{hf_file}: quantization is not a JSON object")
        return _modelopt(quantization, f"{hf_file}: quantization.quant_algo", kv=quantization.get("kv_cache_quant_algo"))
    qc = config.get("quantization_config")
    if qc is None:
        return None
    config_file = path / "config.json"
    if not isinstance(qc, dict):
        raise PreQuantizedError(f"{config_file}: quantization_config is not a JSON object")
    method = qc.get("quant_method")
    if method is None and "quant_algo" in qc:
        method = "modelopt"  # ModelOpt's flat form names no method
    where = f"{config_file}: quantization_config.quant_method {method!r}"
    if method == "modelopt":
        kv = qc.get("kv_cache_quant_algo") or _scheme_format(qc.get("kv_cache_scheme"))
        return _modelopt(qc.get("quantization", qc), f"{config_file}: quantization_config.quant_algo", kv=kv)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    if method == "awq":
        return _awq(qc, where)
    if method == "gptq":
        return _gptq(qc, where)
    if method == "fp8":
        return _fp8(qc, where)
    if method == "mxfp4":
        excluded = _names(qc.get("modules_to_not_convert"))
        return PreQuantized("mxfp4", "GPT-OSS MXFP4 (4-bit blocks of 32 with 8-bit exponent scales)", where, group_size=32, excluded=excluded)
    raise PreQuantizedError(
        f"{config_file}: quantization_config.quant_method {method!r} is not a format this tool reads "
        f"(known: {', '.join(KNOWN_METHODS)}); its weights cannot be read as plain {config.get('torch_dtype') or config.get('dtype') or 'float'} tensors"
    )


def _modelopt(quantization: dict[str, Any], where: str, *, kv: Any) -> PreQuantized:
    algo = quantization.get("quant_algo")
    if not isinstance(algo, str) or not algo:
        raise PreQuantizedError(f"{where} is missing (ModelOpt names its format there, e.g. FP8 or NVFP4)")
    known = _MODELOPT_ALGOS.get(algo.upper())
    if known is None:
        raise PreQuantizedError(f"{where} {algo!r} is not a ModelOpt format this tool knows (known: {', '.join(_MODELOPT_ALGOS)})")
    group = quantization.get("group_size")
    block = (128, 128) if known[0] == "modelopt_fp8_block" else None
    details = tuple((key, str(quantization[key]).lower()) for key in ("has_zero_point", "pre_quant_scale") if key in quantization)
    return PreQuantized(
        known[0],
        known[1],
        f"{where} {algo}",
        group_size=group if isinstance(group, int) and known[0] != "modelopt_fp8_block" else None,
        block_size=(group, group) if block and isinstance(group, int) else block,
        kv_cache=str(kv).upper() if kv else None,
        excluded=_names(quantization.get("exclude_modules")),
        details=details,
    )


def _compressed_tensors(qc: dict[str, Any], where: str) -> PreQuantized:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise PreQuantizedError(f"{where}: config_groups is missing or empty (compressed-tensors names its schemes there)")
    schemes = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise PreQuantizedError(f"{where}: config_groups.{name}.weights is missing")
        schemes.add(_ct_scheme(weights, group.get("input_activations"), f"{where}: config_groups.{name}"))
    if len(schemes) > 1:
        raise PreQuantizedError(f"{where}: config_groups mix schemes ({', '.join(sorted(s[1] for s in schemes))}); one scheme per checkpoint is read")
    fmt, label, strategy, group_size, block = schemes.pop()
    details = (("strategy", strategy), ("format", str(qc.get("format", "?"))))
    return PreQuantized(
        fmt,
        f"compressed-tensors {label}",
        where,
        group_size=group_size,
        block_size=block,
        kv_cache=_scheme_format(qc.get("kv_cache_scheme")),
        excluded=_names(qc.get("ignore")),
        details=details,
    )


def _ct_scheme(weights: dict[str, Any], activations: Any, where: str) -> tuple[str, str, str, int | None, tuple[int, int] | None]:
    kind, bits, strategy = weights.get("type", "int"), weights.get("num_bits"), str(weights.get("strategy", "tensor"))
    acts = activations if isinstance(activations, dict) else None
    group = weights.get("group_size") if strategy == "group" else None
    structure = weights.get("block_structure")
    block = (int(structure[0]), int(structure[1])) if strategy == "block" and isinstance(structure, list) and len(structure) == 2 else None
    if kind == "float" and bits == 8:
        return "ct_fp8", f"FP8 ({strategy} weight scales{', FP8 activations' if acts else ', weight-only'})", strategy, group, block
    if kind == "float" and bits == 4:
        return "ct_nvfp4", "NVFP4", strategy, group or weights.get("group_size"), None
    if kind == "int" and bits == 8:
        return ("ct_int8", "INT8 W8A8", strategy, group, None) if acts else ("ct_w8a16", "INT8 weight-only (W8A16)", strategy, group, None)
    if kind == "int" and bits == 4 and not acts:
        return "ct_w4a16", "INT4 weight-only (W4A16)", strategy, group, None
    raise PreQuantizedError(f"{where}: weights of type {kind!r} with num_bits {bits!r} are not a compressed-tensors scheme this tool reads")


def _awq(qc: dict[str, Any], where: str) -> PreQuantized:
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    if bits != 4:
        raise PreQuantizedError(f"{where}: bits {bits!r}: AutoAWQ checkpoints hold 4-bit weights")
    details = (("zero_point", str(qc.get("zero_point", True)).lower()), ("version", str(qc.get("version", "gemm")).lower()))
    excluded = _names(qc.get("modules_to_not_convert"))
    return PreQuantized("awq_int4", "AutoAWQ INT4 (W4A16, packed int32)", where, group_size=_group(group, where), excluded=excluded, details=details)


def _gptq(qc: dict[str, Any], where: str) -> PreQuantized:
    bits, group = qc.get("bits"), qc.get("group_size")
    if bits not in (2, 3, 4, 8):
        raise PreQuantizedError(f"{where}: bits {bits!r} is not a GPTQ width (2, 3, 4 or 8)")
    details = (
        ("bits", str(bits)),
        ("desc_act", str(bool(qc.get("desc_act", False))).lower()),
        ("sym", str(bool(qc.get("sym", True))).lower()),
    )
    excluded = _names(qc.get("modules_to_not_convert"))
    return PreQuantized(f"gptq_int{bits}", f"GPTQ INT{bits} (packed int32)", where, group_size=_group(group, where), excluded=excluded, details=details)


def _fp8(qc: dict[str, Any], where: str) -> PreQuantized:
    block = qc.get("weight_block_size")
    excluded = _names(qc.get("modules_to_not_convert") or qc.get("ignored_layers"))
    details = (("activation_scheme", str(qc.get("activation_scheme", "dynamic"))),)
    if block is None:
        return PreQuantized("fp8_tensor", "FP8 (per-tensor weight_scale)", where, excluded=excluded, details=details)
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise PreQuantizedError(f"{where}: weight_block_size {block!r} must be two positive integers, e.g. [128, 128]")
    return PreQuantized(
        "fp8_block", "FP8 block scales (DeepSeek-V3 style weight_scale_inv)", where, block_size=(block[0], block[1]), excluded=excluded, details=details
    )


def _group(group: Any, where: str) -> int | None:
    if group in (None, -1, 0):
        return None  # one scale per output channel over the whole input
    if not isinstance(group, int) or group < 0:
        raise PreQuantizedError(f"{where}: group_size {group!r} must be a positive integer (or -1: per channel)")
    return group


def _scheme_format(scheme: Any) -> str | None:
    if not isinstance(scheme, dict):
        return None
    kind, bits = scheme.get("type", "float"), scheme.get("num_bits")
    return f"{'FP' if kind == 'float' else 'INT'}{bits}" if bits else None


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()

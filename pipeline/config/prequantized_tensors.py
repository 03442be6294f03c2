"""A checkpoint's quantized tensors, from the safetensors headers, checked against what it declares.

Each format stores its codes and scales under its own names and shapes (the sources are cited in
pipeline.config.prequantized; the layouts, per quantized linear layer of `out` × `in` weights):
- ModelOpt / compressed-tensors FP8, HF `fp8`: `weight` F8_E4M3 [out, in], `weight_scale` of one element (per
  tensor), [out] or [out, 1] (per channel), `input_scale` one element when activations are static.
- FP8 blocks: `weight_scale` (ModelOpt, compressed-tensors) or `weight_scale_inv` (DeepSeek-V3)
  [ceil(out / rows), ceil(in / columns)].
- ModelOpt INT4 AWQ / W4A8: `weight` U8 [out / 2, in] (two nibbles a byte), `weight_scale` [out, in / group].
- NVFP4 (ModelOpt `weight`, compressed-tensors `weight_packed`): U8 [out, in / 2], `weight_scale` F8_E4M3 [out, in / 16].
- AutoAWQ: `qweight` I32 [in, out / 8], `scales` [in / group, out], `qzeros` I32 [in / group, out / 8].
- GPTQ: `qweight` I32 [in × bits / 32, out], `scales` [in / group, out], `qzeros` I32, `g_idx` I32 [in].
- compressed-tensors W4A16 (`pack-quantized`): `weight_packed` I32 [out, in / 8], `weight_scale` [out, in / group].
- GPT-OSS MXFP4: `<name>_blocks` U8 [..., in / 32, 16], `<name>_scales` U8 [...,in / 32].

Only headers are read, except the floating-point scale tensors: their values are read (raw bytes, no numpy) to
refuse NaN, infinite and zero scales, up to SCALE_BYTES_READ in all.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.prequantized import PreQuantized
from pipeline.config.weight_checks import safetensors_header

SCALE_BYTES_READ = 64 << 20  # values of scale tensors read for the NaN / zero check, at most
_FP8 = ("F8_E4M3", "F8_E5M2")
_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale", ".weight_scale_2", ".scales", "_scales", ".k_scale", ".v_scale")
_FLOAT_CODES = {"F32": ("f", 4), "F16": ("e", 2), "BF16": ("bf16", 2), "F64": ("d", 8)}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the data in `file`
    end: int


def read_tensors(path: Path, weight_files: tuple[str, ...]) -> dict[str, Tensor]:
    """Every tensor of the checkpoint's safetensors files, by name (headers only)."""
    tensors: dict[str, Tensor] = {}
    for name in weight_files:
        file = path / name
        header = safetensors_header(file)
        with file.open("rb") as handle:
            base = 8 + int.from_bytes(handle.read(8), "little")  # the data follows the 8-byte length and the header
        for key, entry in header.items():
            if key == "__metadata__" or not isinstance(entry, dict):
                continue
            begin, end = (entry.get("data_offsets") or [0, 0])[:2]
            tensors[key] = Tensor(key, str(entry.get("dtype")), tuple(entry.get("shape") or ()), file, base + begin, base + end)
    return tensors


def undeclared_quantization(tensors: dict[str, Tensor]) -> str | None:
    """A tensor that holds quantized codes or their scales, in a checkpoint that declares no quantization."""
    ordered = sorted(tensors.values(), key=lambda t: t.name)
    codes = next((t for t in ordered if t.name.endswith(".weight") and t.dtype in _FP8), None)
    if codes is not None:
        return f"{codes.name} is {codes.dtype}"
    other = next((t for t in ordered if t.name.endswith((".qweight", ".weight_packed", "_blocks", ".weight_scale", ".weight_scale_inv"))), None)
    return None if other is None else f"{other.name} ({other.dtype} {list(other.shape)}) is a quantized layer's tensor"


def tensor_issues(found: PreQuantized, tensors: dict[str, Tensor]) -> list[str]:
    """What the tensors contradict in the declaration: codes of another dtype, missing or misshapen scales, NaN or zero
    scale values. Each message names the file and tensor."""
    layers = _quantized_layers(found, tensors)
    if not layers:
        expected = _EXPECTED_CODES.get(_kind(found), "quantized codes")
        example = next((t for t in tensors.values() if t.name.endswith("proj.weight")), None)
        seen = f"; e.g. {example.name} in {example.file} is {example.dtype}" if example else ""
        return [f"{found.where} declares {found.label}, but no tensor holds {expected}{seen}"]
    issues: list[str] = []
    missing = [(weight, scale) for weight, scale in layers if scale not in tensors]
    if missing:
        codes, absent = missing[0]
        more = f" (and {len(missing) - 1} more layers)" if len(missing) > 1 else ""
        issues.append(f"{codes.file}: {codes.name} has no scale tensor {absent}{more}; {found.label} needs one per quantized layer")
    for weight, scale_name in layers:
        scale = tensors.get(scale_name)
        if scale is None:
            continue
        shape = _scale_shape(found, weight)
        if shape is not None and not _same_shape(scale.shape, shape):
            issues.append(
                f"{scale.file}: {scale.name} has shape {list(scale.shape)}, but {weight.name} {list(weight.shape)} in {found.label} needs {list(shape)}"
            )
            break
    issues += _bad_scale_values(tensors)
    return issues


_EXPECTED_CODES = {
    "fp8": "float8_e4m3fn (F8_E4M3) weights",
    "packed_u8": "packed uint8 weights",
    "int8": "int8 weights",
    "int32_packed": "packed int32 weights (qweight / weight_packed)",
    "mxfp4": "MXFP4 blocks (*_blocks, U8)",
}


def _kind(found: PreQuantized) -> str:
    f = found.format
    if f in ("modelopt_fp8", "modelopt_fp8_per_channel", "modelopt_fp8_block", "ct_fp8", "fp8_tensor", "fp8_block"):
        return "fp8"
    if f in ("modelopt_nvfp4", "modelopt_int4_awq", "modelopt_w4a8_awq", "modelopt_w4a8_nvfp4_fp8", "ct_nvfp4"):
        return "packed_u8"
    if f in ("modelopt_int8_sq", "modelopt_int8_wo", "ct_int8", "ct_w8a16"):
        return "int8"
    if f == "mxfp4":
        return "mxfp4"
    if f.startswith(("gptq", "awq")) or f == "ct_w4a16":
        return "int32_packed"
    return "mixed"


def _quantized_layers(found: PreQuantized, tensors: dict[str, Tensor]) -> list[tuple[Tensor, str]]:
    """(codes tensor, the name its scale must have) for every quantized layer the format stores."""
    kind, pairs = _kind(found), []
    for t in tensors.values():
        if kind == "fp8" and t.name.endswith(".weight") and t.dtype in _FP8:
            suffix = "_scale_inv" if found.format == "fp8_block" else "_scale"
            pairs.append((t, t.name + suffix))
        elif kind in ("packed_u8", "int8") and t.dtype == ("U8" if kind == "packed_u8" else "I8") and t.name.endswith((".weight", ".weight_packed")):
            pairs.append((t, t.name.removesuffix("_packed") + "_scale"))
        elif kind == "int32_packed" and t.dtype == "I32" and t.name.endswith((".qweight", ".weight_packed")):
            scale = t.name.removesuffix(".qweight") + ".scales" if t.name.endswith(".qweight") else t.name.removesuffix("_packed") + "_scale"
            pairs.append((t, scale))
        elif kind == "mxfp4" and t.name.endswith("_blocks"):
            pairs.append((t, t.name.removesuffix("_blocks") + "_scales"))
        elif kind == "mixed" and t.name.endswith(".weight") and t.dtype in (*_FP8, "U8", "I8"):
            pairs.append((t, t.name + "_scale"))
    return pairs


def _scale_shape(found: PreQuantized, weight: Tensor) -> tuple[int, ...] | None:
    """The scale shape the format stores for `weight`; None where this check does not know it."""
    shape, f, group = weight.shape, found.format, found.group_size
    if len(shape) != 2 and f != "mxfp4":
        return None
    strategy = dict(found.details).get("strategy")
    if f in ("modelopt_fp8", "fp8_tensor") or (f == "ct_fp8" and strategy == "tensor"):
        return (1,)
    if f == "modelopt_fp8_per_channel" or (f == "ct_fp8" and strategy == "channel"):
        return (shape[0],)
    if found.block_size is not None and f in ("modelopt_fp8_block", "fp8_block", "ct_fp8"):
        rows, cols = found.block_size
        return (math.ceil(shape[0] / rows), math.ceil(shape[1] / cols))
    if f in ("modelopt_int4_awq", "modelopt_w4a8_awq") and group:
        return (shape[0] * 2, shape[1] // group)
    if f in ("modelopt_nvfp4", "ct_nvfp4"):
        return (shape[0], shape[1] * 2 // (group or 16))
    if f == "awq_int4" and group:
        return (shape[0] // group, shape[1] * 8)
    if f.startswith("gptq_int"):
        bits = int(f.removeprefix("gptq_int"))
        rows = shape[0] * 32 // bits
        return (rows // group if group else 1, shape[1])
    if f == "ct_w4a16" and group:
        return (shape[0], shape[1] * 8 // group)
    if f == "mxfp4":
        return shape[:-1]
    return None


def _same_shape(actual: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if actual == expected:
        return True
    # One element stored as [] or [1]; one scale per channel stored as [n] or [n, 1].
    squeeze = tuple(d for d in actual if d != 1)
    return squeeze == tuple(d for d in expected if d != 1)


def _bad_scale_values(tensors: dict[str, Tensor]) -> list[str]:
    budget = SCALE_BYTES_READ
    for t in sorted(tensors.values(), key=lambda x: x.name):
        if not t.name.endswith(_SCALE_SUFFIXES) or t.dtype not in _FLOAT_CODES:
            continue
        size = t.end - t.start
        if size > budget:
            return []  # beyond the read budget: the check stops here (the user page says so)
        budget -= size
        values = _floats(t)
        bad = next((v for v in values if math.isnan(v) or math.isinf(v) or v == 0.0), None)
        if bad is not None:
            what = "NaN" if math.isnan(bad) else ("infinite" if math.isinf(bad) else "zero")
            return [f"{t.file}: {t.name} holds a {what} scale; the layer's dequantized weights would be {what if what != 'zero' else 'all zero'}"]
    return []


def _floats(t: Tensor) -> list[float]:
    with t.file.open("rb") as handle:
        handle.seek(t.start)
        raw = handle.read(t.end - t.start)
    code, width = _FLOAT_CODES[t.dtype]
    count = len(raw) // width
    if code == "bf16":  # the upper half of a float32
        return list(struct.unpack(f"<{count}f", b"".join(b"\x00\x00" + raw[i : i + 2] for i in range(0, count * 2, 2))))
    return list(struct.unpack(f"<{count}{code}", raw[: count * width]))

"""What `validate` answers, per build.target, for a checkpoint that is already quantized.

Served as published, with no calibration: a ModelOpt unified checkpoint (hf_quant_config.json) in a format this
project's converter takes (FP8 per-tensor, INT4 AWQ, W4A8 AWQ; FP8 or INT8 KV cache or none) on a target whose
quantize stage converts (`converts_published`: engine, cpu) with quantize.algo none and quantize.kv_cache none. It
is exactly what this project's quantize stage writes before converting (pipeline.quantization.modelopt_export), so
the stage converts model.source directly (`published_recipe`, pipeline.quantization.dispatch). Everything else is
refused, with what would work instead:
- engine and cpu, other formats: the converter does not read them, and read as plain weights their codes would be
  cast to the model dtype with their scales dropped (garbage, no error anywhere).
- llmapi: its quantize stage loads the weights with transformers and re-exports them through ModelOpt
  (pipeline.quantization.job); the build links that export, not the user's files, so the checkpoint is not
  passed through as published.
- TensorRT-LLM 1.2's PyTorch backend itself reads several of these formats as published (`LLM(model=dir)`,
  `trtllm-serve dir`): hf_quant_config.json first, then config.json's quantization_config (DeepSeek FP8 blocks,
  mxfp4, compressed-tensors), NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py @008e0af8
  (`load_hf_quant_config`); its linear layers have methods for FP8 per-tensor / rowwise / block, NVFP4, W4A16 and
  W4A8 AWQ, per-channel weight-only, and refuse INT8 SmoothQuant (tensorrt_llm/_torch/modules/linear.py,
  `get_quant_method`); compressed-tensors FP8 from NVIDIA/TensorRT-LLM#10796. Dense GPTQ is still open there
  (vllm-project/vllm has it; NVIDIA/TensorRT-LLM#19442), and 1.2's convert_checkpoint.py took AutoAWQ / AutoGPTQ
  INT4 for Llama with desc_act off only (NVIDIA/TensorRT-LLM#2458).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.config.families import family_of
from pipeline.config.model_info import ModelInfo
from pipeline.config.prequantized import PreQuantized, PreQuantizedError, declared_quantization
from pipeline.config.prequantized_tensors import Tensor, read_tensors, tensor_issues, undeclared_quantization
from pipeline.config.spec import Spec, Target
from pipeline.config.targets import TARGET_TRAITS, traits_of
from pipeline.config.weight_checks import WeightHeaderError, read_json_object
from pipeline.quant_formats import kv_cache_format_named, weight_format

Issue = tuple[tuple[str | int, ...], str]

# format id -> (what the PyTorch backend answers, the quantize.algo that makes the same format here from unquantized weights)
PYTORCH_BACKEND_READS = "TensorRT-LLM 1.2's PyTorch backend loads it as published (`trtllm-serve DIR` or `LLM(model=DIR)`, outside this pipeline)"
_NOT_RECORDED = "TensorRT-LLM 1.2's PyTorch backend is not recorded to read it"
FORMATS: dict[str, tuple[str, str | None]] = {
    "modelopt_fp8": (PYTORCH_BACKEND_READS, "fp8"),
    "modelopt_fp8_per_channel": (PYTORCH_BACKEND_READS, None),
    "modelopt_fp8_block": (PYTORCH_BACKEND_READS, None),
    "modelopt_nvfp4": (PYTORCH_BACKEND_READS, "nvfp4"),
    "modelopt_int4_awq": (PYTORCH_BACKEND_READS, "int4_awq"),
    "modelopt_w4a8_awq": (PYTORCH_BACKEND_READS, "w4a8_awq"),
    "modelopt_int8_sq": ("TensorRT-LLM 1.2's PyTorch backend refuses it (unsupported quant mode W8A8_SQ_PER_CHANNEL)", "int8_sq"),
    "modelopt_int8_wo": (PYTORCH_BACKEND_READS, "int8_wo"),
    "modelopt_w4a8_nvfp4_fp8": (PYTORCH_BACKEND_READS, None),
    "modelopt_mixed": (PYTORCH_BACKEND_READS + " with its quant_cfg.json", None),
    "ct_fp8": (PYTORCH_BACKEND_READS + " (NVIDIA/TensorRT-LLM#10796)", "fp8"),
    "ct_int8": (_NOT_RECORDED, "int8_sq"),
    "ct_w8a16": (_NOT_RECORDED, "int8_wo"),
    "ct_w4a16": (_NOT_RECORDED, "int4_awq"),
    "ct_nvfp4": (_NOT_RECORDED, "nvfp4"),
    "awq_int4": (_NOT_RECORDED + "; TensorRT-LLM 1.2's examples convert_checkpoint.py took AutoAWQ INT4 for Llama (NVIDIA/TensorRT-LLM#2458)", "int4_awq"),
    "fp8_tensor": (_NOT_RECORDED, "fp8"),
    "fp8_block": (PYTORCH_BACKEND_READS + " (DeepSeek-V3 FP8 block scales)", None),
    "mxfp4": (PYTORCH_BACKEND_READS + " (GPT-OSS MXFP4)", None),
}
_GPTQ = ("dense GPTQ is still open in TensorRT-LLM's PyTorch backend (NVIDIA/TensorRT-LLM#19442); 1.2's examples "
         "convert_checkpoint.py took AutoGPTQ INT4 for Llama with desc_act off only (NVIDIA/TensorRT-LLM#2458)")  # fmt: skip
# ModelOpt unified formats the converter (pipeline.quantization.trtllm_checkpoint.convert) writes a TensorRT-LLM
# checkpoint from, as published -> the quantize.algo whose export has the same layout
CONVERTED_AS_PUBLISHED = {"modelopt_fp8": "fp8", "modelopt_int4_awq": "int4_awq", "modelopt_w4a8_awq": "w4a8_awq"}
SERVED = "served as published, no calibration"
_CONVERTED = "ModelOpt FP8 (per-tensor), INT4 AWQ and W4A8 AWQ"
_WHY_NOT = {  # by the target's model backend (config.targets.traits_of)
    "trtllm-build": "its converter writes the TensorRT-LLM checkpoint from published " + _CONVERTED + " checkpoints only; read "
    "as plain weights, these quantized codes would be cast to {dtype} and their scales dropped",
    "refengine": "refengine runs the TensorRT-LLM checkpoint the quantize stage converts, from published " + _CONVERTED + " "
    "checkpoints only; read as plain weights, these quantized codes would be cast to {dtype} and their scales dropped",
    "pytorch": "its quantize stage loads the weights with transformers and re-exports them through ModelOpt, and the build "
    "links that export, so the checkpoint is not passed through as published (a pass-through is not built yet)",
}


def answer_for(found: PreQuantized) -> tuple[str, str | None]:
    """(what TensorRT-LLM's PyTorch backend answers, the quantize.algo that builds the same format here)."""
    if found.format.startswith("gptq_int"):
        return _GPTQ, "int4_awq" if found.format == "gptq_int4" else None
    return FORMATS[found.format]


def published_recipe(found: PreQuantized, target: Target) -> tuple[str, str] | None:
    """(quantize.algo, quantize.kv_cache) of the published format when `target` serves it as published; else None."""
    algo = CONVERTED_AS_PUBLISHED.get(found.format)
    kv = kv_cache_format_named(found.kv_cache)
    if algo is None or kv is None or not traits_of(target).converts_published:
        return None
    if not (weight_format(algo).runs_on(target.value) and kv.runs_on(target.value)):
        return None
    return algo, kv.name


def _served_on() -> str:
    return " and ".join(t.value for t, traits in TARGET_TRAITS.items() if traits.converts_published)


def prequantized_issues(spec: Spec, info: ModelInfo) -> list[Issue]:
    """A pre-quantized model.source refused for spec.build.target, naming the file and key or tensor, the format found,
    the target and what would work; and its declaration checked against the tensors."""
    where = ("model", "source")
    try:
        found, tensors = inspect_quantization(info)
    except PreQuantizedError as exc:
        return [(where, str(exc))]
    except (WeightHeaderError, OSError):
        return []  # the header checks of model_checks report an unreadable file already
    if found is None:
        undeclared = undeclared_quantization(tensors)
        if undeclared is None:
            return []
        return [
            (
                where,
                f"{info.path}: {undeclared}, but neither config.json (quantization_config) nor hf_quant_config.json declares "
                "the format; read as plain weights these codes are garbage (add the declaration its producer writes, or "
                "use the unquantized checkpoint)",
            )
        ]
    if not info.weight_files:
        # A config-only directory (the GPU examples of models/): no weight can be mis-read here, and the prepare stage
        # refuses it until the weights are downloaded into it; then this refusal applies (quantization_summary says so).
        return []
    issues: list[Issue] = [(where, message) for message in tensor_issues(found, tensors)]
    algo, kv = spec.quantize.algo.value, spec.quantize.kv_cache.value
    if algo != "none" or kv != "none":
        issues.append(
            (
                ("quantize", "algo") if algo != "none" else ("quantize", "kv_cache"),
                f"quantize.algo {algo} / quantize.kv_cache {kv} on a pre-quantized checkpoint ({found.label}, from {found.where}) "
                "would re-quantize quantized codes; set both to none to serve it as published, or start from the unquantized checkpoint",
            )
        )
    target, dtype = spec.build.target, spec.model.dtype.value
    recipe = published_recipe(found, target)
    if recipe is not None:
        family = family_of(info.model_type)
        why = family.format_refusal(target, recipe[0]) if family is not None else None
        if family is not None and why:
            issues.append((where, f"{found.where}: {found.label} is refused for {family.name} on build.target {target.value}: {why}"))
        return issues
    reads, same_algo = answer_for(found)
    works = [reads]
    if found.format in CONVERTED_AS_PUBLISHED:
        works.append(f"build.target {_served_on()} serve it as published (quantize.algo none)")
    elif not traits_of(target).exports_unified_hf and reads == PYTORCH_BACKEND_READS:
        works.append("build.target llmapi will take it once its pass-through is built (it is not yet)")
    if same_algo is not None:
        kv_hint = f" and quantize.kv_cache {found.kv_cache.lower()}" if found.kv_cache in ("FP8", "INT8") else ""
        works.append(f"or point model.source at the unquantized checkpoint and set quantize.algo {same_algo}{kv_hint} to quantize it here")
    why_not = _WHY_NOT[traits_of(target).model_backend].format(dtype=dtype)
    issues.append(
        (
            where,
            f"{found.where}: the checkpoint is pre-quantized ({found.describe(source=False)}); build.target {target.value} does not "
            f"serve pre-quantized checkpoints in this format: {why_not}. What would work: {'; '.join(works)}",
        )
    )
    return issues


def inspect_quantization(info: ModelInfo) -> tuple[PreQuantized | None, dict[str, Tensor]]:
    """The declared quantization (None: none) and the checkpoint's tensors (headers)."""
    config, error = read_json_object(Path(info.path) / "config.json")
    if error is not None:
        raise PreQuantizedError(error)
    return declared_quantization(Path(info.path), config), read_tensors(Path(info.path), info.weight_files)


def quantization_summary(info: ModelInfo, target: Target | None = None) -> str:
    """One line for `validate` and `plan`: the checkpoint's weight dtypes, the quantization it declares and, given
    build.target, whether it is served as published."""
    try:
        found, tensors = inspect_quantization(info)
    except (PreQuantizedError, WeightHeaderError, OSError) as exc:
        return f"weights: not read ({exc})"
    dtypes = Counter(t.dtype for t in tensors.values())
    counted = ", ".join(f"{count} {dtype}" for dtype, count in dtypes.most_common())
    if found is None:
        return f"weights: not pre-quantized ({counted or 'no tensors'}; no quantization_config, no hf_quant_config.json)"
    if not info.weight_files:
        return (
            f"weights: not in {info.path} (config.json only), which declares a pre-quantized checkpoint: {found.describe()}; "
            f"once the weights are there, {_once_there(found)} (docs/prequantized.md)"
        )
    served = f"; {SERVED} on build.target {target.value}" if target is not None and published_recipe(found, target) else ""
    return f"weights: pre-quantized, {found.describe()}; tensors: {counted}{served}"


def _once_there(found: PreQuantized) -> str:
    if found.format in CONVERTED_AS_PUBLISHED:
        return f"build.target {_served_on()} serve it as published and validate refuses it elsewhere"
    return "validate refuses it on every build.target"


def published_checkpoint(hf_dir: Path, target: Target) -> tuple[PreQuantized, str, str] | None:
    """For the quantize stage: (the declaration, quantize.algo, quantize.kv_cache) of a checkpoint served as published,
    None for one that declares no quantization; a declared format `target` does not serve is a PreQuantizedError
    (validate refused it first; a cast of quantized codes must never happen)."""
    config, error = read_json_object(Path(hf_dir) / "config.json")
    if error is not None:
        raise PreQuantizedError(error)
    found = declared_quantization(Path(hf_dir), config)
    if found is None:
        return None
    recipe = published_recipe(found, target)
    if recipe is None:
        raise PreQuantizedError(f"{found.where}: {found.label} is not served as published on build.target {target.value}")
    return found, *recipe

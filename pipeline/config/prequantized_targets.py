"""What `validate` answers, per build.target, for a checkpoint that is already quantized.

No target serves a pre-quantized checkpoint yet, so every one is refused, with what would work instead:
- engine and cpu: the quantize stage loads the checkpoint as plain weights and writes the TensorRT-LLM checkpoint
  from them; with quantize.algo none a float8 code would be cast to float16 and its scale dropped (garbage, no
  error anywhere).
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

from pipeline.config.model_info import ModelInfo
from pipeline.config.prequantized import PreQuantized, PreQuantizedError, declared_quantization
from pipeline.config.prequantized_tensors import Tensor, read_tensors, tensor_issues, undeclared_quantization
from pipeline.config.spec import Spec
from pipeline.config.targets import traits_of
from pipeline.config.weight_checks import WeightHeaderError, read_json_object

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
_WHY_NOT = {  # by the target's model backend (config.targets.traits_of)
    "trtllm-build": "the quantize stage reads model.source as plain weights and its converter writes the TensorRT-LLM checkpoint "
    "from them, so the quantized codes would be cast to {dtype} and their scales dropped",
    "refengine": "refengine runs the TensorRT-LLM checkpoint the quantize stage writes from model.source read as plain weights, "
    "so it would compute with the quantized codes cast to {dtype} and their scales dropped",
    "pytorch": "its quantize stage loads the weights with transformers and re-exports them through ModelOpt, and the build "
    "links that export, so the checkpoint is not passed through as published (a pass-through is not built yet)",
}


def answer_for(found: PreQuantized) -> tuple[str, str | None]:
    """(what TensorRT-LLM's PyTorch backend answers, the quantize.algo that builds the same format here)."""
    if found.format.startswith("gptq_int"):
        return _GPTQ, "int4_awq" if found.format == "gptq_int4" else None
    return FORMATS[found.format]


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
    target, dtype = spec.build.target.value, spec.model.dtype.value
    reads, same_algo = answer_for(found)
    works = [reads]
    if traits_of(spec.build.target).model_backend != "pytorch" and reads == PYTORCH_BACKEND_READS:
        works.append("build.target llmapi will take it once its pass-through is built (it is not yet)")
    if same_algo is not None:
        kv = f" and quantize.kv_cache {found.kv_cache.lower()}" if found.kv_cache in ("FP8", "INT8") else ""
        works.append(f"or point model.source at the unquantized checkpoint and set quantize.algo {same_algo}{kv} to quantize it here")
    issues.append(
        (
            where,
            f"{found.where}: the checkpoint is pre-quantized ({found.describe(source=False)}); build.target {target} does not "
            f"serve pre-quantized checkpoints: {_WHY_NOT[traits_of(spec.build.target).model_backend].format(dtype=dtype)}. What would work: {'; '.join(works)}",
        )
    )
    algo, kv = spec.quantize.algo.value, spec.quantize.kv_cache.value
    if algo != "none" or kv != "none":
        issues.append(
            (
                ("quantize", "algo") if algo != "none" else ("quantize", "kv_cache"),
                f"quantize.algo {algo} / quantize.kv_cache {kv} on a pre-quantized checkpoint ({found.label}, from {found.where}) "
                "would re-quantize quantized codes; start from the unquantized checkpoint",
            )
        )
    return issues


def inspect_quantization(info: ModelInfo) -> tuple[PreQuantized | None, dict[str, Tensor]]:
    """The declared quantization (None: none) and the checkpoint's tensors (headers)."""
    config, error = read_json_object(Path(info.path) / "config.json")
    if error is not None:
        raise PreQuantizedError(error)
    return declared_quantization(Path(info.path), config), read_tensors(Path(info.path), info.weight_files)


def quantization_summary(info: ModelInfo) -> str:
    """One line for `validate` and `plan`: the checkpoint's weight dtypes and the quantization it declares."""
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
            "once the weights are there, validate refuses it on every build.target (docs/prequantized.md)"
        )
    return f"weights: pre-quantized, {found.describe()}; tensors: {counted}"

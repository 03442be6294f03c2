"""The quantization formats: one frozen record per weight format (`quantize.algo`) and per KV-cache format
(`quantize.kv_cache`), and the rules that combine a weight format, a KV-cache format and a GPU.

Every format fact the pipeline uses is a field here: the TensorRT-LLM names a checkpoint carries, the ModelOpt
recipe, calibration, bytes per weight and per KV element, the targets and GPUs that run a format, and the
trtllm-build features a format excludes. Records are keyed by the YAML values of `pipeline.config.spec.QuantAlgo`
and `KVCacheQuant` (the YAML vocabulary stays there; a test keeps both in step). This module imports nothing from
the pipeline and nothing heavy, so the spec's validators, `validate` and `plan` read it.

Sources: NVIDIA/TensorRT-LLM, 1.2 release line: tensorrt_llm/quantization/mode.py (QuantAlgo), builder.py (build-time
constraints), plugin/plugin.py (plugin flags), examples/quantization/quantize.py (--qformat -> ModelOpt config),
examples/lookahead/README.md (support matrix); nvidia-modelopt 0.47.0, modelopt/torch/quantization/config.py (the
configs) and modelopt/torch/export (the quantization blocks it exports). Bytes: 16-bit 2 B, 8-bit 1 B, INT4 0.5 B
plus one 16-bit scale per group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = [
    "TARGETS",
    "FP8_MIN_SM",
    "BLACKWELL_SMS",
    "WeightFormat",
    "KVCacheFormat",
    "WEIGHT_FORMATS",
    "KV_CACHE_FORMATS",
    "weight_format",
    "kv_cache_format",
    "weight_format_named",
    "kv_cache_format_named",
    "recipe_quantization",
    "needs_calibration",
    "fp8_context_fmha_loss",
    "paged_context_fmha_loss",
    "sm_needed",
    "algos_where",
    "sm_version",
    "listed",
]

TARGETS = ("engine", "cpu", "llmapi")  # the build.target values a record may refuse
FP8_MIN_SM = 89  # FP8 tensor cores (Ada, Hopper and newer); also the floor of FP8 context FMHA (builder.py)
# SM 10.x–11.x: trtllm-build refuses INT8/INT4 weight-only, SmoothQuant, per-channel/per-token scaling, INT8 KV (builder.py)
BLACKWELL_SMS = range(100, 120)
_SIXTEEN_BIT = 2.0  # bytes of a float16/bfloat16 value

Loss = Literal["kv_cache", "weights", "gpu"]
PagedContextFmha = Literal["kept", "off", "with_fp8_context_fmha"]


@dataclass(frozen=True)
class WeightFormat:
    """One `quantize.algo`: how it is made, what it costs, where it runs, and what trtllm-build does with it."""

    name: str  # the quantize.algo value
    trtllm_quant_algo: str | None  # checkpoint quantization.quant_algo (a QuantAlgo name); None: unquantized
    modelopt_config: str | None  # ModelOpt 0.47 mtq config it is calibrated with; None: no PTQ (as quantize.py maps --qformat)
    bytes_per_weight: float  # per decoder-layer parameter, fixed-size block scales included
    group_wise: bool = False  # INT4 groups of quantize.group_size along the input dim (AWQ), one 16-bit scale each
    calibration_needs_cuda: bool = False  # only CUDA runs ModelOpt's fake-quant model of it (0.47 asserts a CUDA amax)
    refused_targets: Mapping[str, str] = field(default_factory=dict)  # build.target -> the rest of "quantize.algo X ..."
    min_sm: int | None = None  # lowest compute capability that runs it (89 = SM 8.9)
    gpu_need: str = ""  # what min_sm stands for, in "quantize.algo X needs ..."
    blackwell_rejected: bool = False  # trtllm-build refuses it on BLACKWELL_SMS (builder.py)
    fp8_context_fmha: bool = False  # FP8 context FMHA runs with these weights (builder.py: FP8, W4A8_AWQ, NVFP4)
    fp8_qdq: bool = False  # FP8 per-tensor QDQ: fp8 GEMM plugin, strongly typed network, 16-bit paged context FMHA without FP8 KV
    fused_mlp: bool = False  # use_fused_mlp survives (builder.py forces it off for any quant but FP8)
    # The TensorRT-LLM layer whose forward() asserts "lora is not supported on ... now" (tensorrt_llm/quantization/
    # layers.py); weight-only, group-wise (AWQ) and FP8 layers add the LoRA branch.
    lora_rejected_by: str | None = None
    # ModelOpt's export folds an activation (pre-quant) scale into the norm before the Linear (SmoothQuant, AWQ): a LoRA
    # update on the cpu engine would read the scaled input, not the model's (refengine/lora/modules.py).
    folds_input_scale: bool = False
    lookahead_documented: bool = False  # in examples/lookahead's support matrix (FP16 / BF16 / FP8)
    gemm_plugin: str | None = None  # the --gemm_plugin choice that belongs to this format
    gemm_plugin_auto: bool = False  # trtllm-build enables that GEMM plugin by itself (build.py)
    builder_plugin: tuple[str, str] | None = None  # (plugin_config field trtllm-build sets to the dtype, for what) (builder.py)
    eight_bit_gemm: bool = False  # its GEMMs run on 8-bit tensor cores (the planner's FP8/INT8 dense TFLOPS), else 16-bit math

    def __post_init__(self) -> None:
        object.__setattr__(self, "refused_targets", MappingProxyType(dict(self.refused_targets)))

    @property
    def quantized(self) -> bool:
        return self.trtllm_quant_algo is not None

    @property
    def calibrated(self) -> bool:
        """Whether quantizing needs calibration text: every ModelOpt PTQ recipe runs calibration batches."""
        return self.modelopt_config is not None

    def bytes_per_param(self, group_size: int = 128) -> float:
        """Bytes per decoder-layer parameter; group-wise formats add one 16-bit scale per group (0.516 B at 128)."""
        return self.bytes_per_weight + (_SIXTEEN_BIT / group_size if self.group_wise else 0.0)

    def runs_on(self, target: str) -> bool:
        return _value(target) not in self.refused_targets


@dataclass(frozen=True)
class KVCacheFormat:
    """One `quantize.kv_cache`: how the KV cache is stored and what it does to trtllm-build's attention features."""

    name: str  # the quantize.kv_cache value
    trtllm_kv_quant_algo: str | None  # checkpoint quantization.kv_cache_quant_algo (FP8, INT8, NVFP4); None: model dtype
    modelopt_num_bits: int | tuple[int, int] | None  # num_bits of ModelOpt's k/v bmm quantizers ((4, 3) = E4M3)
    bytes_per_element: float  # per K or V element
    refused_targets: Mapping[str, str] = field(default_factory=dict)  # build.target -> the rest of "quantize.kv_cache X ..."
    min_sm: int | None = None
    gpu_need: str = ""
    blackwell_rejected: bool = False
    fp8: bool = False  # FP8 values: trtllm-build forces a strongly typed network (builder.py)
    paged_context_fmha: PagedContextFmha = "kept"  # off: always lost; with_fp8_context_fmha: lost unless FP8 context FMHA runs

    def __post_init__(self) -> None:
        object.__setattr__(self, "refused_targets", MappingProxyType(dict(self.refused_targets)))

    @property
    def quantized(self) -> bool:
        return self.trtllm_kv_quant_algo is not None

    def runs_on(self, target: str) -> bool:
        return _value(target) not in self.refused_targets


_FP8_TENSOR_CORES = "FP8 tensor cores (SM >= 8.9, Ada/Hopper or newer)"
_NO_PYTORCH_INT8 = (
    "does not run on build.target llmapi: the TensorRT-LLM PyTorch backend has no INT8 SmoothQuant or INT8 weight-only "
    "kernels (use target engine, or algo fp8 / int4_awq / w4a8_awq)"
)

WEIGHT_FORMATS: Mapping[str, WeightFormat] = MappingProxyType(
    {
        f.name: f
        for f in (
            WeightFormat("none", None, None, _SIXTEEN_BIT, fused_mlp=True, lookahead_documented=True),
            WeightFormat(
                "fp8",
                "FP8",
                "FP8_DEFAULT_CFG",
                1.0,
                min_sm=FP8_MIN_SM,
                gpu_need=_FP8_TENSOR_CORES,
                fp8_context_fmha=True,
                fp8_qdq=True,
                fused_mlp=True,
                lookahead_documented=True,
                gemm_plugin="fp8",
                eight_bit_gemm=True,
            ),
            WeightFormat(
                "int8_sq",
                "W8A8_SQ_PER_CHANNEL",
                "INT8_SMOOTHQUANT_CFG",
                1.0,
                refused_targets={"llmapi": _NO_PYTORCH_INT8},
                blackwell_rejected=True,
                lora_rejected_by="SmoothQuantLinear",
                folds_input_scale=True,
                eight_bit_gemm=True,
            ),
            # Exported unquantized with quant_algo W8A16; trtllm-build quantizes the weights (ModelOpt's own INT8 weight-only
            # export names its tensors differently from what TensorRT-LLM's W8A16 loader expects: a preprocessed int8 weight with `per_channel_scale`).
            WeightFormat(
                "int8_wo",
                "W8A16",
                None,
                1.0,
                refused_targets={"llmapi": _NO_PYTORCH_INT8},
                blackwell_rejected=True,
                builder_plugin=("weight_only_quant_matmul_plugin", "weight-only INT8"),
            ),
            WeightFormat(
                "int4_awq",
                "W4A16_AWQ",
                "INT4_AWQ_CFG",
                0.5,
                group_wise=True,
                blackwell_rejected=True,
                folds_input_scale=True,
                builder_plugin=("weight_only_groupwise_quant_matmul_plugin", "group-wise INT4"),
            ),
            WeightFormat(
                "w4a8_awq",
                "W4A8_AWQ",
                "W4A8_AWQ_BETA_CFG",
                0.5,
                group_wise=True,
                min_sm=FP8_MIN_SM,
                gpu_need=_FP8_TENSOR_CORES,
                fp8_context_fmha=True,
                builder_plugin=("weight_only_groupwise_quant_matmul_plugin", "group-wise INT4"),
                folds_input_scale=True,
                eight_bit_gemm=True,
            ),
            WeightFormat(
                "nvfp4",
                "NVFP4",
                "NVFP4_DEFAULT_CFG",
                0.5 + 1 / 16,
                calibration_needs_cuda=True,  # + an FP8 scale per 16 weights
                refused_targets={"cpu": "needs build.target engine: NVFP4 runs only on Blackwell GPUs, not on the cpu reference engine"},
                min_sm=100,
                gpu_need="a Blackwell GPU (SM >= 10.0)",
                fp8_context_fmha=True,
                lora_rejected_by="FP4Linear",
                gemm_plugin="nvfp4",
                gemm_plugin_auto=True,
                eight_bit_gemm=True,
            ),
        )
    }
)

KV_CACHE_FORMATS: Mapping[str, KVCacheFormat] = MappingProxyType(
    {
        f.name: f
        for f in (
            KVCacheFormat("none", None, None, _SIXTEEN_BIT),
            KVCacheFormat(
                "fp8",
                "FP8",
                (4, 3),
                1.0,
                min_sm=FP8_MIN_SM,
                gpu_need="SM >= 8.9 (Ada/Hopper or newer)",
                fp8=True,
                paged_context_fmha="with_fp8_context_fmha",
            ),
            KVCacheFormat(
                "int8",
                "INT8",
                8,
                1.0,
                refused_targets={"llmapi": "does not run on build.target llmapi (use fp8, or target engine)"},
                blackwell_rejected=True,
                paged_context_fmha="off",
            ),
        )
    }
)


def _value(choice: object) -> str:
    """A YAML enum member or its value."""
    return str(getattr(choice, "value", choice))


def weight_format(algo: object) -> WeightFormat:
    """The record of a quantize.algo (member or value); KeyError for a name that is not one."""
    return WEIGHT_FORMATS[_value(algo)]


def kv_cache_format(kv_cache: object) -> KVCacheFormat:
    return KV_CACHE_FORMATS[_value(kv_cache)]


def weight_format_named(trtllm_quant_algo: str | None) -> WeightFormat | None:
    """The record whose checkpoint says `quant_algo` (null: the unquantized record); None for a name no record has."""
    return next((f for f in WEIGHT_FORMATS.values() if f.trtllm_quant_algo == trtllm_quant_algo), None)


def recipe_quantization(algo: object, kv_cache: object, *, unified: bool = False) -> dict[str, str | None]:
    """The TensorRT-LLM checkpoint's quant_algo / kv_cache_quant_algo for a quantize.algo and quantize.kv_cache; with
    `unified`, what ModelOpt's unified checkpoint (hf_quant_config.json) says instead: no quant_algo for a format made
    without ModelOpt (int8_wo: 16-bit weights, quantized when the engine loads them)."""
    weights = weight_format(algo)
    quant_algo = None if unified and weights.modelopt_config is None else weights.trtllm_quant_algo
    return {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_format(kv_cache).trtllm_kv_quant_algo}


def kv_cache_format_named(trtllm_kv_quant_algo: str | None) -> KVCacheFormat | None:
    name = trtllm_kv_quant_algo.upper() if trtllm_kv_quant_algo is not None else None
    return next((f for f in KV_CACHE_FORMATS.values() if f.trtllm_kv_quant_algo == name), None)


# -- rules over a weight format, a KV-cache format and a GPU ------------------------------------------------------
def needs_calibration(weights: WeightFormat, kv: KVCacheFormat) -> bool:
    """Calibration text is needed for a ModelOpt PTQ recipe and for every quantized KV cache (its scales)."""
    return weights.calibrated or kv.quantized


def sm_needed(weights: WeightFormat, kv: KVCacheFormat) -> int | None:
    """The lowest compute capability that runs both formats (None: any GPU)."""
    needs = [sm for sm in (weights.min_sm, kv.min_sm) if sm is not None]
    return max(needs) if needs else None


def fp8_context_fmha_loss(weights: WeightFormat, sm: int | None = None) -> Loss | None:
    """Why trtllm-build turns FP8 context FMHA off (builder.py): the weights are not FP8-family, or the GPU is below
    SM 8.9 (sm None: no GPU declared, not checked); None when it may run."""
    if not weights.fp8_context_fmha:
        return "weights"
    if sm is not None and sm < FP8_MIN_SM:
        return "gpu"
    return None


def paged_context_fmha_loss(weights: WeightFormat | None, kv: KVCacheFormat, sm: int | None = None) -> Loss | None:
    """Why trtllm-build turns paged context FMHA off for these formats (builder.py), so that neither KV-cache reuse nor
    chunked context can run; None when the formats keep it.

    `kv_cache`: an INT8 KV cache always loses it. An FP8 KV cache keeps it only as FP8 paged context FMHA, so it is
    lost for the reason FP8 context FMHA is (`weights` or `gpu`, see fp8_context_fmha_loss). `weights` None: not
    known (an engine config with another quant_algo), only the KV format's own rule applies.
    """
    if kv.paged_context_fmha == "off":
        return "kv_cache"
    if kv.paged_context_fmha == "with_fp8_context_fmha" and weights is not None:
        return fp8_context_fmha_loss(weights, sm)
    return None


def algos_where(predicate: Callable[[WeightFormat], bool]) -> list[str]:
    """The quantize.algo values whose records satisfy `predicate`, in the YAML's order."""
    return [f.name for f in WEIGHT_FORMATS.values() if predicate(f)]


# -- words ----------------------------------------------------------------------------------------------------------
def sm_version(sm: int) -> str:
    """89 -> '8.9'."""
    return f"{sm // 10}.{sm % 10}"


def listed(names: Sequence[str]) -> str:
    """'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

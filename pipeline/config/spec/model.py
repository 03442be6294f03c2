"""The spec's model and quantize sections: which checkpoint, and how ModelOpt quantizes it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from pipeline.config.spec.choices import KVCacheQuant, ModelDType, QuantAlgo, QuantDevice
from pipeline.config.spec.strict import StrictModel
from pipeline.quant_formats import KV_CACHE_FORMATS, TARGETS, WEIGHT_FORMATS, KVCacheFormat, WeightFormat

# Format facts the field descriptions below state, read from the format registry.
_UNCALIBRATED_ALGOS = " and ".join(f.name for f in WEIGHT_FORMATS.values() if not f.calibrated)


def _refusals(formats: Mapping[str, WeightFormat | KVCacheFormat]) -> str:
    """Which targets refuse which formats: 'nvfp4 on the cpu target, int8_sq and int8_wo on the llmapi target'."""
    refused = {target: [f.name for f in formats.values() if target in f.refused_targets] for target in TARGETS}
    return ", ".join(f"{' and '.join(names)} on the {target} target" for target, names in refused.items() if names)


_REFUSED_ALGOS = _refusals(WEIGHT_FORMATS)
_REFUSED_KV = _refusals(KV_CACHE_FORMATS)


class ModelSpec(StrictModel):
    source: Path = Field(
        description="Local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files); a relative path "
        "is resolved against the YAML file's directory. Safetensors only: pickled checkpoints (.bin/.pt) are refused, "
        "and nothing is downloaded."
    )
    dtype: ModelDType = Field(
        default=ModelDType.float16,
        description="Data type of the non-quantized parts of the exported TensorRT-LLM checkpoint.",
    )
    copy_weights: bool = Field(
        default=False,
        description="Copy the weights into the artifact store (a reflink where the file system can make one), making "
        "the prepare artifact self-contained. false: the store records the source's weight files by content hash and the "
        "stages read them from model.source, re-checked at every read. Configs and tokenizer files are always copied, "
        "and the store never links into the source, so nothing written there reaches your checkpoint.",
    )


class CalibrationSpec(StrictModel):
    files: tuple[str, ...] = Field(
        default=(),
        description="Local text or JSONL files (glob patterns, relative to the YAML file) whose text calibrates "
        f"quantization. Required for every algo except {_UNCALIBRATED_ALGOS}.",
    )
    num_samples: int = Field(default=64, ge=1, le=100_000, description="Number of token windows used for calibration.")
    max_seq_len: int = Field(default=256, ge=8, le=32_768, description="Tokens per calibration window.")
    batch_size: int = Field(default=8, ge=1, le=1024, description="Calibration windows per forward pass.")
    seed: int = Field(default=0, ge=0, description="Seed for choosing calibration windows.")


class QuantizeSpec(StrictModel):
    algo: QuantAlgo = Field(
        default=QuantAlgo.none,
        description="Weight/activation quantization: none, fp8, int8_sq (SmoothQuant W8A8), int8_wo (INT8 "
        "weight-only), int4_awq (W4A16 AWQ), w4a8_awq or nvfp4 (Blackwell GPUs; its calibration needs a CUDA device). "
        f"Refused: {_REFUSED_ALGOS}. INT4 weight-only is not offered: ModelOpt 0.47 exports it as "
        "W4A16_AWQ without the prequant_scaling_factor tensors that format declares, so TensorRT-LLM may not load it; "
        "use int4_awq.",
    )
    kv_cache: KVCacheQuant = Field(default=KVCacheQuant.none, description=f"KV-cache quantization: none, fp8 or int8 (refused: {_REFUSED_KV}).")
    group_size: int = Field(default=128, description="Group size along the input dimension for AWQ formats (64 or 128).")
    device: QuantDevice = Field(
        default=QuantDevice.cpu, description="Where calibration runs: cpu, or cuda (on a GPU, through build.runner where the target builds with it)."
    )
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec, description="Calibration data and its sampling.")

    @field_validator("algo", mode="before")
    @classmethod
    def _int4_weight_only_is_not_offered(cls, value: object) -> object:
        if value == "int4_wo":
            raise ValueError(
                "quantize.algo int4_wo is not offered: ModelOpt 0.47 exports INT4 weight-only as W4A16_AWQ without the "
                "prequant_scaling_factor tensors that format declares, so TensorRT-LLM may not load it; use int4_awq"
            )
        return value

    @model_validator(mode="after")
    def _group_size_choice(self) -> QuantizeSpec:
        if self.group_size not in (64, 128):
            raise ValueError(f"quantize.group_size must be 64 or 128, got {self.group_size}")
        return self

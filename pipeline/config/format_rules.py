"""Which quantization formats each target can run, and the build constraints that concern them.

Facts from shared/reference/trtllm.md (§1.10 constraints, "engine path is legacy": the PyTorch
backend behind the llmapi target runs FP8, NVFP4 and W4A16/W4A8 AWQ, but not INT8 SmoothQuant,
INT8 weight-only or an INT8 KV cache). Every message names the fields involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config.spec import BuildSpec, QuantizeSpec, ServeSpec

NEEDS_CALIBRATION = frozenset({"fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4"})
AWQ_ALGOS = frozenset({"int4_awq", "w4a8_awq"})
_ENGINE_PATH_ONLY = frozenset({"int8_sq", "int8_wo"})
_FP8_CONTEXT_FMHA_ALGOS = frozenset({"fp8", "w4a8_awq", "nvfp4"})


def needs_calibration(quantize: "QuantizeSpec") -> bool:
    return quantize.algo.value in NEEDS_CALIBRATION or quantize.kv_cache.value != "none"


def check_format_rules(quantize: "QuantizeSpec", build: "BuildSpec", serve: "ServeSpec") -> None:
    algo, kv, target = quantize.algo.value, quantize.kv_cache.value, build.target.value
    if target == "llmapi":
        if algo in _ENGINE_PATH_ONLY:
            raise ValueError(
                f"quantize.algo {algo} does not run on build.target llmapi: the TensorRT-LLM PyTorch backend has no "
                "INT8 SmoothQuant or INT8 weight-only kernels (use target engine, or algo fp8 / int4_awq / w4a8_awq)"
            )
        if kv == "int8":
            raise ValueError("quantize.kv_cache int8 does not run on build.target llmapi (use fp8, or target engine)")
    if target == "cpu" and algo == "nvfp4":
        raise ValueError("quantize.algo nvfp4 needs build.target engine: NVFP4 runs only on Blackwell GPUs, not on the cpu reference engine")
    if needs_calibration(quantize) and not quantize.calibration.files:
        raise ValueError(
            f"quantize.calibration.files is empty, but quantize.algo {algo} with quantize.kv_cache {kv} needs calibration text"
        )
    plugins = build.plugins
    if target == "engine" and "use_fp8_context_fmha" in plugins.model_fields_set and plugins.use_fp8_context_fmha and algo not in _FP8_CONTEXT_FMHA_ALGOS:
        # Left at its default, the build turns it off with a recorded decision; asked for explicitly, it is an error.
        raise ValueError(
            f"build.plugins.use_fp8_context_fmha: true needs quantize.algo fp8, w4a8_awq or nvfp4, got {algo} "
            "(FP8 context attention runs on FP8-quantized models only)"
        )
    if target == "engine" and kv == "fp8" and algo not in _FP8_CONTEXT_FMHA_ALGOS:
        for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
            if getattr(serve, field):
                raise ValueError(
                    f"serve.{field}: true is not possible with quantize.kv_cache fp8 and quantize.algo {algo}: "
                    "trtllm-build turns paged context FMHA off for an FP8 KV cache unless the weights are fp8, w4a8_awq or nvfp4"
                )

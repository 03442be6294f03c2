"""The spec's quantization-format checks: the rules of `pipeline.quant_formats`, applied to one spec's quantize,
build and serve sections. Every message names the fields involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import quant_formats
from pipeline.config.targets import traits_of
from pipeline.quant_formats import KVCacheFormat, WeightFormat, algos_where, kv_cache_format, listed, weight_format

if TYPE_CHECKING:
    from pipeline.config.spec import BuildSpec, QuantizeSpec, ServeSpec

_FP8_CONTEXT_FMHA_ALGOS = algos_where(lambda f: f.fp8_context_fmha)


def needs_calibration(quantize: QuantizeSpec) -> bool:
    return quant_formats.needs_calibration(weight_format(quantize.algo), kv_cache_format(quantize.kv_cache))


def check_format_rules(quantize: QuantizeSpec, build: BuildSpec, serve: ServeSpec, *, model_known: bool = True, calibrates: bool = True) -> None:
    """The rules, raising ValueError naming the fields. `model_known` False (the spec's own check, before model.source is
    read): with quantize.algo none the weights may be a published checkpoint's format, so the rule that depends on the
    weights alone waits for the model checks (pipeline.config.effective_quantization.format_rule_issues). `calibrates`
    False: a checkpoint served as published, which is not calibrated."""
    weights, kv, target = weight_format(quantize.algo), kv_cache_format(quantize.kv_cache), build.target.value
    traits = traits_of(build.target)
    if traits.follows_trtllm_plugin_rules:
        _check_paged_context_features(weights, kv, serve)
    for field, record in (("quantize.algo", weights), ("quantize.kv_cache", kv)):
        if not record.runs_on(target):
            raise ValueError(f"{field} {record.name} {record.refused_targets[target]}")
    if calibrates and needs_calibration(quantize) and not quantize.calibration.files:
        raise ValueError(f"quantize.calibration.files is empty, but quantize.algo {weights.name} with quantize.kv_cache {kv.name} needs calibration text")
    plugins = build.plugins
    explicit = "use_fp8_context_fmha" in plugins.model_fields_set and plugins.use_fp8_context_fmha
    deferred = not model_known and weights.name == "none"
    if traits.runs_fp8_context_fmha and explicit and not deferred and quant_formats.fp8_context_fmha_loss(weights) is not None:
        # Left at its default, the build turns it off with a recorded decision; asked for explicitly, it is an error.
        raise ValueError(
            f"build.plugins.use_fp8_context_fmha: true needs quantize.algo {listed(_FP8_CONTEXT_FMHA_ALGOS)}, got "
            f"{weights.name} (FP8 context attention runs on FP8-quantized models only)"
        )


def _check_paged_context_features(weights: WeightFormat, kv: KVCacheFormat, serve: ServeSpec) -> None:
    loss = quant_formats.paged_context_fmha_loss(weights, kv)  # the GPU's part is checked when the engine is planned
    if loss is None:
        return
    for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if not getattr(serve, field):
            continue
        if loss == "kv_cache":
            raise ValueError(
                f"serve.{field}: true is not possible with quantize.kv_cache: {kv.name} "
                f"(TensorRT-LLM turns paged context FMHA off for an {kv.trtllm_kv_quant_algo} KV cache)"
            )
        raise ValueError(
            f"serve.{field}: true is not possible with quantize.kv_cache {kv.name} and quantize.algo {weights.name}: "
            f"trtllm-build turns paged context FMHA off for an {kv.trtllm_kv_quant_algo} KV cache unless the weights are "
            f"{listed(_FP8_CONTEXT_FMHA_ALGOS)}"
        )

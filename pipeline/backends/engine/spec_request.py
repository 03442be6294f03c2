"""The engine target's build settings of a Spec: a BuildRequest, as trtllm_build resolves and renders it."""

from __future__ import annotations

from typing import Any

from pipeline.backends.engine.build_request import BuildRequest
from pipeline.config.effective_quantization import effective_quantize
from pipeline.config.lora_adapters import spec_target_modules
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.speculative.registry import rules_for


def request_from_spec(spec: Spec, model: ModelInfo) -> BuildRequest:
    """The spec as trtllm-build settings. Reads the first LoRA adapter's adapter_config.json when build.lora lists no
    target modules (trtllm-build would take them from there; the command names them explicitly). The quantization is
    the one the build runs with (a published checkpoint's own format: pipeline.config.effective_quantization)."""
    build, plugins, quantize = spec.build, spec.build.plugins, effective_quantize(spec, model.path)
    return BuildRequest(
        name=spec.name,
        architecture=model.architecture,
        dtype=spec.model.dtype.value,
        quant_algo=quantize.algo.value,
        kv_cache_quant=quantize.kv_cache.value,
        group_size=quantize.group_size,
        tp_size=build.tp_size,
        pp_size=build.pp_size,
        max_batch_size=build.max_batch_size,
        max_input_len=build.max_input_len,
        max_seq_len=build.max_seq_len,
        model_max_seq_len=model.default_max_seq_len(),
        max_num_tokens=build.max_num_tokens,
        opt_num_tokens=build.opt_num_tokens,
        max_beam_width=build.max_beam_width,
        tokens_per_block=build.tokens_per_block,
        kv_cache_type=build.kv_cache_type.value,
        gpt_attention_plugin=plugins.gpt_attention_plugin.value,
        gemm_plugin=plugins.gemm_plugin.value,
        context_fmha=plugins.context_fmha,
        use_paged_context_fmha=plugins.use_paged_context_fmha,
        use_fp8_context_fmha=plugins.use_fp8_context_fmha,
        use_fused_mlp=plugins.use_fused_mlp,
        remove_input_padding=plugins.remove_input_padding,
        reduce_fusion=plugins.reduce_fusion,
        multiple_profiles=plugins.multiple_profiles,
        enable_kv_cache_reuse=spec.serve.enable_kv_cache_reuse,
        enable_chunked_context=spec.serve.enable_chunked_context,
        gather_context_logits=build.gather_context_logits,
        **_lora_settings(spec),
        **_speculative_settings(spec),
    )


def _lora_settings(spec: Spec) -> dict[str, Any]:
    lora = spec.build.lora
    if lora is None:
        return {}
    modules = spec_target_modules(lora)
    return {
        "lora_plugin": spec.model.dtype.value,  # the LoRA plugin runs in the model's dtype (what `auto` resolves to)
        "lora_dirs": tuple(str(d) for d in lora.adapter_dirs),
        "lora_ckpt_source": lora.adapter_source.value,
        "lora_target_modules": modules,
        "max_lora_rank": lora.max_rank,
    }


def _speculative_settings(spec: Spec) -> dict[str, Any]:
    speculative = spec.build.speculative
    if speculative is None:
        return {}
    eagle_layers = rules_for(speculative.mode).num_eagle_layers(speculative)
    return {"speculative_decoding_mode": speculative.engine_mode, "max_draft_len": speculative.draft_len, "num_eagle_layers": eagle_layers}

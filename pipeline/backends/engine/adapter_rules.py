"""trtllm-build's rules for LoRA and speculative decoding (see build_rules.py for the rest and the sources)."""

from __future__ import annotations

from pipeline.backends.engine.build_resolution import Resolution
from pipeline.backends.engine.eagle_rules import PAGED_CONTEXT_FMHA_REASON, request_eagle_problems
from pipeline.quant_formats import algos_where, listed

# what this pipeline can produce a checkpoint and repository for (draft_tokens_external: with a draft engine and the BLS)
SPECULATIVE_MODES_BUILT = frozenset({"lookahead_decoding", "draft_tokens_external", "medusa", "eagle"})
# MedusaConfig wraps LLaMAConfig or QWenConfig (tensorrt_llm/models/medusa/config.py); the support matrix of
# examples/medusa lists FP16/BF16, and quantization/quantize.py combines heads with a ModelOpt FP8 base
MEDUSA_BASES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MEDUSA_QUANT_ALGOS = ("none", "fp8")
# examples/lookahead/README.md and examples/draft_target_model/README.md support matrices: compute capability >= 8.0
LOOKAHEAD_MIN_SM = 80


def lora_rules(r: Resolution) -> None:
    s = r.cur
    if s.lora_plugin == "disable":
        if s.lora_dirs or s.lora_target_modules:
            r.error(
                "build.lora.adapter_dirs / build.lora.target_modules are set but the LoRA plugin is disabled "
                "(--lora_plugin disable): trtllm-build applies the --lora_* flags only with the plugin, so the engine "
                "would have no LoRA"
            )
        return
    if not s.lora_target_modules:
        r.error(
            "build.lora has no target modules (neither build.lora.target_modules nor an adapter's target_modules): "
            "the engine would get the LoRA plugin but no LoRA inputs"
        )
    if r.weights.lora_rejected_by is not None:
        takes_lora = algos_where(lambda f: f.quantized and f.lora_rejected_by is None) + algos_where(lambda f: not f.quantized)
        r.error(
            f"build.lora cannot be combined with quantize.algo {s.quant_algo}: TensorRT-LLM's {r.weights.lora_rejected_by} "
            f"asserts that LoRA is not supported on it, so trtllm-build fails; use {listed(takes_lora)}"
        )
    if s.lora_ckpt_source != "hf":
        r.error(f"build.lora.adapter_source {s.lora_ckpt_source}: only Hugging Face PEFT adapters (hf) are built")
    r.warn(
        "plugin_config.lora_plugin",
        f"the LoRA plugin runs in the model dtype {s.dtype}: a request's lora_weights must be "
        f"{s.dtype} (adapters converted with hf_lora_convert.py --storage-type of another dtype are silently ignored, "
        "tensorrtllm_backend#791); the first request of an adapter carries its weights, later ones only lora_task_id",
        kind="note",
        value=s.dtype,
    )


def speculative_rules(r: Resolution) -> None:
    s = r.cur
    mode = s.speculative_decoding_mode
    if mode is None:
        if s.max_draft_len > 0:
            r.error(
                f"build.speculative.max_draft_len ({s.max_draft_len}) > 0 needs a speculative decoding mode "
                "(build.speculative.mode): trtllm-build only reserves draft tokens for a speculative engine"
            )
        return
    if mode not in SPECULATIVE_MODES_BUILT:
        r.error(
            f"build.speculative.mode {mode} is not built by this pipeline (it needs a trained recurrent drafter); "
            f"use {', '.join(sorted(SPECULATIVE_MODES_BUILT))}"
        )
    if s.max_draft_len < 1:
        r.error(f"build.speculative.mode {mode} needs build.speculative.max_draft_len > 0 (got {s.max_draft_len})")
    if s.max_beam_width > 1:
        r.error(
            f"build.speculative.mode {mode} cannot be built with build.max_beam_width {s.max_beam_width}: the runtime "
            "decodes a speculative engine with its own decoding_mode (lookahead for lookahead_decoding), never "
            "beam_search: Triton's decoding_mode is one mode per model ; set max_beam_width 1"
        )
    if s.kv_cache_type != "paged":
        r.error(
            f"build.speculative.mode {mode} needs build.kv_cache_type paged (got {s.kv_cache_type}): speculative "
            "decoding runs under inflight batching on the paged KV cache (examples/lookahead support matrix)"
        )
    if r.sm is not None and r.sm < LOOKAHEAD_MIN_SM:
        r.error(f"build.speculative.mode {mode} needs SM >= 8.0 (Ampere or newer); the GPU is {r.sm_text}")
    if not r.weights.lookahead_documented:  # the lookahead and draft-target support matrices list the same formats
        r.warn(
            "speculative_decoding_mode",
            f"{mode} is documented for FP16/BF16/FP8 models only; quantize.algo {s.quant_algo} is not in that support matrix, verify it on the GPU",
        )
    if mode == "draft_tokens_external" and not (s.use_paged_context_fmha and s.context_fmha):
        r.error(
            "build.plugins.use_paged_context_fmha must be true (with context_fmha) for build.speculative.mode "
            "draft_tokens_external: the target and the draft reuse the KV cache of the sequence at every draft step, "
            "which needs paged context FMHA (examples/draft_target_model/README.md)"
        )
    if s.gather_context_logits:
        r.error("build.gather_context_logits cannot be combined with build.speculative: trtllm-build refuses context logits with max_draft_len > 0")
    if mode == "medusa" and s.architecture not in MEDUSA_BASES:
        r.error(
            f"build.speculative.mode medusa needs a Llama- or Qwen2-family model ({', '.join(MEDUSA_BASES)}); the "
            f"model is {s.architecture}: TensorRT-LLM's MedusaForCausalLM wraps only those"
        )
    if mode == "medusa" and s.quant_algo not in MEDUSA_QUANT_ALGOS:
        r.error(
            f"build.speculative.mode medusa cannot be combined with quantize.algo {s.quant_algo} on build.target "
            "engine: TensorRT-LLM combines Medusa heads with an FP16/BF16 or ModelOpt FP8 base only (examples/medusa "
            "support matrix, quantization/quantize.py); use quantize.algo none or fp8"
        )
    if mode == "eagle":
        r.errors.extend(request_eagle_problems(s))
        r.change("use_paged_context_fmha", True, PAGED_CONTEXT_FMHA_REASON)
    if s.lora_plugin != "disable":
        r.warn("speculative_decoding_mode", "LoRA together with speculative decoding is not a combination TensorRT-LLM documents; verify it on the GPU")


def speculative_sizes(r: Resolution) -> None:
    """builder.build after max_seq_len / max_num_tokens are settled: room for the draft tokens."""
    s = r.cur
    if s.speculative_decoding_mode is None or s.max_draft_len < 1:
        return
    needed = s.max_batch_size * (s.max_draft_len + 1)
    if s.max_num_tokens < needed:
        r.change(
            "max_num_tokens",
            needed,
            f"speculative decoding: trtllm-build raises it to max_batch_size × (max_draft_len + 1) = {s.max_batch_size} × {s.max_draft_len + 1}",
        )
    if s.max_seq_len is None:  # settled by build_rules' sequence-length rule, which runs first
        raise RuntimeError("speculative_sizes runs after max_seq_len is settled")
    r.warn(
        "build_config.max_seq_len",
        f"trtllm-build adds max_draft_len ({s.max_draft_len}) to max_seq_len ({s.max_seq_len}) "
        "for speculative decoding, so the engine records this value; prompt + output stay bounded by build.max_seq_len",
        kind="note",
        value=s.max_seq_len + s.max_draft_len,
    )

"""trtllm-build's build-time constraints and silent auto-overrides, made explicit.

Each rule is one small function over a `Resolution`. It records an error (raised together as one SpecError naming fields and values) or a `Decision` (a value
changed with the reason, a warning, a note), its message stating the rule; rules run in the builder's order, later ones reading earlier decisions. Sources,
NVIDIA/TensorRT-LLM 1.2 line (most rules already in 0.16; builder.py read at 008b2b8d): tensorrt_llm/builder.py `build()` and `check_max_num_tokens`,
commands/build.py (defaults, deduced max_seq_len, refused pairs), plugin/plugin.py; prompt cap without chunked context: issues #2702, #2717; decoding_mode:
triton-inference-server/tensorrtllm_backend all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.backends.engine.adapter_rules import lora_rules, speculative_rules, speculative_sizes
from pipeline.backends.engine.build_request import BuildRequest
from pipeline.backends.engine.build_resolution import Decision, Resolution
from pipeline.errors import SpecError
from pipeline.quant_formats import (
    BLACKWELL_SMS,
    FP8_MIN_SM,
    KV_CACHE_FORMATS,
    algos_where,
    fp8_context_fmha_loss,
    listed,
    paged_context_fmha_loss,
    sm_needed,
    sm_version,
)

REDUCE_FUSION_ARCHS = frozenset({"LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM"})
MAX_NUM_TOKENS_WARN = 16384
_FP8_NEEDS_SM = f"SM >= {sm_version(FP8_MIN_SM)}"


def _seq_len(r: Resolution) -> None:
    s = r.cur
    if s.max_seq_len is None:
        r.change("max_seq_len", s.model_max_seq_len, "deduced like trtllm-build: max_position_embeddings × RoPE factor", kind="note")
    elif s.max_seq_len > s.model_max_seq_len:
        r.warn("max_seq_len", f"larger than the model's deduced maximum {s.model_max_seq_len}; trtllm-build warns")
    s = r.cur
    if s.max_input_len >= r.max_seq_len:
        r.error(
            f"build.max_input_len ({s.max_input_len}) must be less than build.max_seq_len ({s.max_seq_len}); "
            "every request needs room for one output token, and trtllm-build would clip it silently"
        )


def _profiles(r: Resolution) -> None:
    s = r.cur
    if s.opt_num_tokens is not None and s.multiple_profiles:
        r.error(f"build.opt_num_tokens ({s.opt_num_tokens}) cannot be set with build.plugins.multiple_profiles: true (trtllm-build rejects the combination)")
    if s.max_num_tokens < s.tokens_per_block:
        r.error(f"build.max_num_tokens ({s.max_num_tokens}) is less than build.tokens_per_block ({s.tokens_per_block}); trtllm-build would raise it silently")


def _gpu(r: Resolution) -> None:
    s, sm, weights, kv = r.cur, r.sm, r.weights, r.kv
    blackwell_bad = weights.blackwell_rejected or kv.blackwell_rejected
    if sm is None:
        needed = sm_needed(weights, kv)
        if needed is not None:
            r.warn(
                "quant_algo",
                f"no GPU declared: quantize.algo {s.quant_algo} / quantize.kv_cache {s.kv_cache_quant} need "
                f"SM >= {needed}; declare the GPU to check before building",
            )
        if blackwell_bad:
            r.warn(
                "quant_algo",
                f"no GPU declared: quantize.algo {s.quant_algo} / quantize.kv_cache {s.kv_cache_quant} cannot be built for Blackwell (SM 10.x–11.x)",
            )
        return
    if weights.min_sm is not None and sm < weights.min_sm:
        r.error(f"quantize.algo {s.quant_algo} needs {weights.gpu_need}; the GPU is {r.sm_text}")
    if kv.min_sm is not None and sm < kv.min_sm:
        runs_here = [k.name for k in KV_CACHE_FORMATS.values() if k.min_sm is None or k.min_sm <= sm]
        r.error(f"quantize.kv_cache {s.kv_cache_quant} needs {kv.gpu_need}; the GPU is {r.sm_text} (use kv_cache {listed(runs_here)})")
    if sm in BLACKWELL_SMS and blackwell_bad:
        what = f"quantize.algo {s.quant_algo}" if weights.blackwell_rejected else f"quantize.kv_cache {s.kv_cache_quant}"
        builds = algos_where(lambda f: f.quantized and not f.blackwell_rejected)
        r.error(
            f"{what} is rejected by trtllm-build on Blackwell ({r.sm_text}): INT8/INT4 weight-only, SmoothQuant, "
            f"per-channel/per-token scaling and INT8 KV cache are not supported on SM 10.x–11.x; "
            f"use {listed(builds)}"
        )


def _kv_cache_type(r: Resolution) -> None:
    s = r.cur
    if s.kv_cache_type == "paged" and s.gpt_attention_plugin == "disable":
        r.error(
            "build.kv_cache_type paged needs build.plugins.gpt_attention_plugin (got disable): the paged KV cache "
            "and inflight batching run in the GPT attention plugin"
        )
    if s.kv_cache_type != "paged":
        r.change("use_paged_context_fmha", False, f"paged context FMHA reads a paged KV cache; build.kv_cache_type is {s.kv_cache_type}")


def _gemm_plugin(r: Resolution) -> None:
    s, weights = r.cur, r.weights
    owners = algos_where(lambda f: f.gemm_plugin == s.gemm_plugin)  # a quantized GEMM plugin belongs to its format
    if owners and s.quant_algo not in owners:
        r.error(f"build.plugins.gemm_plugin {s.gemm_plugin} needs quantize.algo {listed(owners)} (got {s.quant_algo})")
    if weights.gemm_plugin_auto and s.gemm_plugin == "disable":
        r.change(
            "gemm_plugin",
            weights.gemm_plugin,
            f"{weights.trtllm_quant_algo} checkpoints run their GEMMs in the {weights.gemm_plugin} GEMM plugin (trtllm-build auto-enables it)",
        )


def _context_fmha(r: Resolution) -> None:
    if not r.cur.context_fmha:
        why = "build.plugins.context_fmha is false, which disables paged and FP8 context FMHA"
        r.change("use_paged_context_fmha", False, why)
        r.change("use_fp8_context_fmha", False, why)


def _fp8_context_fmha(r: Resolution) -> None:
    loss = fp8_context_fmha_loss(r.weights, r.sm)
    if loss == "weights":
        algos = listed(algos_where(lambda f: f.fp8_context_fmha))
        r.change("use_fp8_context_fmha", False, f"FP8 context FMHA needs quantize.algo {algos} (got {r.cur.quant_algo})")
    elif loss == "gpu":  # _gpu has already recorded an error for this; mirrors builder.build for completeness
        r.change("use_fp8_context_fmha", False, f"FP8 context FMHA needs {_FP8_NEEDS_SM}; the GPU is {r.sm_text}")


def _paged_context_fmha_loss(r: Resolution) -> None:
    s = r.cur
    loss = paged_context_fmha_loss(r.weights, r.kv, r.sm)
    if loss == "kv_cache":
        r.change(
            "use_paged_context_fmha",
            False,
            f"quantize.kv_cache {s.kv_cache_quant}: trtllm-build turns paged context FMHA off (so no KV-cache reuse and no chunked context)",
        )
    elif loss == "weights":
        r.change(
            "use_paged_context_fmha",
            False,
            f"FP8 paged context FMHA needs FP8-family weights; quantize.kv_cache {s.kv_cache_quant} with quantize.algo {s.quant_algo} turns it off",
        )
    elif loss == "gpu":
        r.change("use_paged_context_fmha", False, f"FP8 paged context FMHA needs {_FP8_NEEDS_SM}; the GPU is {r.sm_text}")


def _paged_context_fmha(r: Resolution) -> None:
    s, weights, kv = r.cur, r.weights, r.kv
    if not s.use_paged_context_fmha:
        return
    if kv.paged_context_fmha == "with_fp8_context_fmha" and not s.use_fp8_context_fmha:
        r.change("use_fp8_context_fmha", True, "paged context FMHA with an FP8 KV cache forces FP8 context FMHA on")
    elif weights.fp8_qdq and not kv.fp8 and s.use_fp8_context_fmha:
        r.change(
            "use_fp8_context_fmha", False, "FP8 weights without an FP8 KV cache: paged context FMHA runs in 16 bit, trtllm-build turns FP8 context FMHA off"
        )


def _fused_mlp(r: Resolution) -> None:
    if r.cur.use_fused_mlp and not r.weights.fused_mlp:
        r.change("use_fused_mlp", False, f"the fused gate/up GEMM supports only unquantized or FP8 weights, not quantize.algo {r.cur.quant_algo}")


def _reduce_fusion(r: Resolution) -> None:
    s = r.cur
    if s.reduce_fusion and (s.tp_size == 1 or s.architecture not in REDUCE_FUSION_ARCHS):
        why = f"build.tp_size is {s.tp_size}" if s.tp_size == 1 else f"architecture {s.architecture} is not one of {', '.join(sorted(REDUCE_FUSION_ARCHS))}"
        r.change("reduce_fusion", False, f"reduce_fusion needs tp_size > 1 and a Llama/Gemma2/Medusa architecture; {why}")


def _num_tokens(r: Resolution) -> None:
    s, max_seq_len = r.cur, r.max_seq_len
    cap = s.max_batch_size * max_seq_len
    if not s.remove_input_padding:
        why = "without remove_input_padding trtllm-build ignores it and uses max_batch_size × max_seq_len"
        r.change("max_num_tokens", cap, why)
        r.change("opt_num_tokens", None, why)
        return
    if s.max_num_tokens > cap:
        r.change("max_num_tokens", cap, f"clamped to max_batch_size × max_seq_len = {s.max_batch_size} × {s.max_seq_len}")
    if not r.cur.context_fmha and r.cur.max_num_tokens < s.max_input_len:
        r.change("max_num_tokens", s.max_input_len, "without context FMHA a whole prompt must fit one step: raised to max_input_len")
    s = r.cur
    if s.opt_num_tokens is not None and s.opt_num_tokens > s.max_num_tokens:
        r.change("opt_num_tokens", s.max_num_tokens, "clamped to max_num_tokens")
    if s.max_num_tokens > MAX_NUM_TOKENS_WARN:
        r.warn("max_num_tokens", f"above {MAX_NUM_TOKENS_WARN}: activations may exceed TensorRT's tensor-volume limit")
    if s.max_num_tokens % s.tokens_per_block:
        r.warn("max_num_tokens", f"not a multiple of tokens_per_block ({s.tokens_per_block}); chunked context wants one")
    chunked = s.enable_chunked_context and s.use_paged_context_fmha and s.context_fmha
    if not chunked and s.max_num_tokens < s.max_input_len:
        r.warn(
            "max_num_tokens",
            f"without chunked context the runtime caps prompts at min(max_seq_len - 1, max_num_tokens) = "
            f"{min(max_seq_len - 1, s.max_num_tokens)} tokens, below build.max_input_len ({s.max_input_len})",
        )


def _notes(r: Resolution) -> None:
    s, weights = r.cur, r.weights
    if weights.fp8_qdq or r.kv.fp8:
        r.warn("build_config.strongly_typed", "FP8 weights or an FP8 KV cache force a strongly typed network", kind="note", value=True)
    if weights.builder_plugin is not None:
        plugin, what = weights.builder_plugin
        r.warn(f"plugin_config.{plugin}", f"set by trtllm-build for {what}", kind="note", value=s.dtype)
    if s.world_size > 1:
        r.warn(
            "plugin_config.nccl_plugin",
            f"forced on by trtllm-build for world size {s.world_size}; tp/pp come from the checkpoint's mapping, not from a trtllm-build flag",
            kind="note",
            value="enabled",
        )


def _serve_needs(r: Resolution) -> None:
    s = r.cur
    if s.use_paged_context_fmha and s.context_fmha:
        return
    why = [str(d) for d in r.decisions if d.field == "build.plugins.use_paged_context_fmha" and d.kind == "changed"]
    for attr in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(s, attr):
            r.error(
                f"serve.{attr}: true needs paged context FMHA in the engine, but build.plugins.use_paged_context_fmha "
                f"ends up false ({'; '.join(why) or 'as configured'})"
            )


RULES: tuple[Callable[[Resolution], None], ...] = (
    _seq_len,
    _profiles,
    _gpu,
    _kv_cache_type,
    _gemm_plugin,
    lora_rules,
    speculative_rules,
    _context_fmha,
    _fp8_context_fmha,
    _paged_context_fmha_loss,
    _paged_context_fmha,
    _fused_mlp,
    _reduce_fusion,
    _num_tokens,
    speculative_sizes,
    _notes,
    _serve_needs,
)


def resolve(request: BuildRequest, sm: int | None) -> tuple[BuildRequest, tuple[Decision, ...]]:
    """Apply trtllm-build's rules to `request`: (applied settings, decisions), or one SpecError listing every violation."""
    if sm is not None and not 50 <= sm <= 150:
        raise SpecError(f"GPU compute capability must be an integer like 80, 89, 90 or 100 (SM 8.0 -> 80), got {sm}")
    resolution = Resolution(request, sm)
    for rule in RULES:
        rule(resolution)
    if resolution.errors:
        raise SpecError(
            f"{request.name}: trtllm-build cannot build this config ({resolution.sm_text}):\n  - " + "\n  - ".join(resolution.errors),
            hint="change the named fields; `trtllm-pipeline validate CONFIG` checks without building",
        )
    return resolution.cur, tuple(resolution.decisions)

"""The `parameters` of the `tensorrt_llm` model, per target, from the engine and the serve spec.

Engine target: every parameter of the `tensorrtllm` C++ backend (the `parameters` of NVIDIA's
`all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`, triton-inference-server/tensorrtllm_backend) gets an
explicit value. The few that do not apply to a decoupled-only, single-node leader-mode deployment
are left out on purpose, because an empty string would be read as a value: encoder_model_path and
cross_kv_cache_fraction (encoder-decoder models), max_tokens_in_paged_kv_cache (the fraction sizes
the cache), participant_ids (orchestrator mode), and tokenizer_dir / guided_decoding_backend /
xgrammar_tokenizer_info_path (guided decoding). gpu_device_ids is written only when GPUs are
listed; lookahead_window_size / _ngram_size / _verification_set_size only for a lookahead engine
(with decoding_mode lookahead, which makes the backend read them); medusa_choices only for a Medusa engine, in
NVIDIA's string form ("{0}, {0, 0}, {1}": build.speculative.medusa.choices, the tree requests use unless they send
their own), eagle_choices only for an EAGLE-1/2 engine (build.speculative.eagle.choices or NVIDIA's default, written
out: the backend's own default is the same tree, but the spec's is what the engine was sized for). The lora_cache_* values are the
backend's defaults unless the engine has LoRA, then serve.lora's (cache_max_adapter_size defaults to
the engine's max_lora_rank); lora_prefetch_dir is serve.lora.prefetch_dir's, when set.

Cpu target: what the Python model reads (tensorrt_llm_cpu.py); a Medusa engine adds decoding_mode medusa and
medusa_choices as on the engine target (refengine checks the tree against its heads at load).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.backends.attention_windows import window_vector
from pipeline.backends.engine_facts import EngineFacts
from pipeline.config.spec import GuidedDecodingBackend, ServeLoraSpec, ServeSpec, SpeculativeSpec
from pipeline.speculative.registry import rules_for

EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
CANCELLATION_CHECK_PERIOD_MS = 100
# Triton decoding_mode of a speculative engine (model_instance_state.cc: top_k, top_p, top_k_top_p, beam_search,
# medusa, redrafter, lookahead, eagle).
SPECULATIVE_DECODING_MODES = {"lookahead_decoding": "lookahead", "medusa": "medusa", "explicit_draft_tokens": "redrafter", "eagle": "eagle"}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def decoding_mode(facts: EngineFacts) -> str:
    """What the backend must decode the engine with: its speculative mode's, else top_k_top_p or beam_search."""
    mode = SPECULATIVE_DECODING_MODES.get(facts.speculative_decoding_mode or "")
    if mode is not None:
        return mode
    return "top_k_top_p" if facts.max_beam_width == 1 else "beam_search"


def lora_cache(serve: ServeSpec, max_lora_rank: int) -> tuple[int, int, float, int]:
    """(optimal adapter size, max adapter size, GPU memory fraction, host bytes) of the LoRA cache of an engine that
    takes adapters up to `max_lora_rank` (the cache's largest adapter size unless serve.lora says otherwise)."""
    lora = serve.lora or ServeLoraSpec()
    largest = lora.cache_max_adapter_size if lora.cache_max_adapter_size is not None else max_lora_rank
    optimal = lora.cache_optimal_adapter_size if serve.lora is not None else min(lora.cache_optimal_adapter_size, largest)
    return optimal, largest, lora.cache_gpu_memory_fraction, lora.cache_host_memory_bytes


def engine_parameters(
    facts: EngineFacts,
    serve: ServeSpec,
    *,
    engine_dir: str,
    gpu_device_ids: Sequence[int] = (),
    speculative: SpeculativeSpec | None = None,
) -> dict[str, str]:
    parameters = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "max_beam_width": str(facts.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "batch_scheduler_policy": serve.batch_scheduler_policy.value,
        "kv_cache_free_gpu_mem_fraction": repr(float(serve.kv_cache_free_gpu_mem_fraction)),
        "kv_cache_host_memory_bytes": "0",
        "kv_cache_onboard_blocks": "true",
        "max_attention_window_size": ",".join(map(str, window_vector(facts.layer_windows, facts.max_seq_len))) or str(facts.max_seq_len),
        "sink_token_length": "0",
        "enable_kv_cache_reuse": _bool(serve.enable_kv_cache_reuse),
        "enable_chunked_context": _bool(serve.enable_chunked_context),
        "exclude_input_in_output": _bool(serve.exclude_input_in_output),
        "normalize_log_probs": "true",
        "cancellation_check_period_ms": str(CANCELLATION_CHECK_PERIOD_MS),
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": "1000",
        "request_stats_max_iterations": "0",
        "decoding_mode": decoding_mode(facts),
        "speculative_decoding_fast_logits": "false",
        "gpu_weights_percent": "1.0",
        "enable_context_fmha_fp32_acc": "false",
        "multi_block_mode": "true",
        "cuda_graph_mode": "false",
        "cuda_graph_cache_size": "0",
        "num_nodes": "1",
        "lora_cache_optimal_adapter_size": "8",
        "lora_cache_max_adapter_size": "64",
        "lora_cache_gpu_memory_fraction": "0.05",
        "lora_cache_host_memory_bytes": str(1 << 30),
        "executor_worker_path": EXECUTOR_WORKER_PATH,
    }
    if facts.lora_plugin is not None:
        optimal, largest, fraction, host_bytes = lora_cache(serve, facts.max_lora_rank)
        parameters.update(
            lora_cache_optimal_adapter_size=str(optimal),
            lora_cache_max_adapter_size=str(largest),
            lora_cache_gpu_memory_fraction=repr(float(fraction)),
            lora_cache_host_memory_bytes=str(host_bytes),
        )
        if serve.lora is not None and serve.lora.prefetch_dir is not None:
            parameters["lora_prefetch_dir"] = serve.lora.prefetch_dir
    parameters.update(speculative_parameters(facts, speculative))
    if gpu_device_ids:
        parameters["gpu_device_ids"] = gpu_device_id_groups(gpu_device_ids, facts.tp_size * facts.pp_size)
    return parameters


def speculative_parameters(facts: EngineFacts, speculative: SpeculativeSpec | None) -> dict[str, str]:
    """The decoding parameters of build.speculative's mode for an engine built in it (lookahead's (W, N, G), a Medusa
    or EAGLE-1/2 engine's decoding_mode and tree): pipeline.speculative's rules of the mode."""
    if speculative is None:
        return {}
    return rules_for(speculative.mode).triton_parameters(facts, speculative)


def gpu_device_id_groups(gpu_device_ids: Sequence[int], per_instance: int) -> str:
    """`0,1;2,3`: one comma-separated GPU set per model instance."""
    groups = [gpu_device_ids[i : i + per_instance] for i in range(0, len(gpu_device_ids), per_instance)]
    return ";".join(",".join(str(gpu) for gpu in group) for group in groups)


def cpu_parameters(serve: ServeSpec, facts: EngineFacts, *, engine_dir: str, speculative: SpeculativeSpec | None = None) -> dict[str, str]:
    """The cpu model's parameters; an engine with LoRA gets the lora_cache_* sizes refengine's cache reads (the largest
    rank and the host bytes; the GPU ones have nothing to size) and serve.lora.prefetch_dir as lora_prefetch_dir."""
    lora: dict[str, str] = {}
    if facts.lora_plugin is not None:
        _, largest, _, host_bytes = lora_cache(serve, facts.max_lora_rank)
        lora = {"lora_cache_max_adapter_size": str(largest), "lora_cache_host_memory_bytes": str(host_bytes)}
        if serve.lora is not None and serve.lora.prefetch_dir is not None:
            lora["lora_prefetch_dir"] = serve.lora.prefetch_dir
    return {
        **lora,
        "engine_dir": engine_dir,
        "max_beam_width": str(facts.max_beam_width),  # NVIDIA's parameter: the engine's, as engine_parameters
        "batch_scheduler_policy": serve.batch_scheduler_policy.value,
        "enable_kv_cache_reuse": _bool(serve.enable_kv_cache_reuse),
        "enable_chunked_context": _bool(serve.enable_chunked_context),
        "exclude_input_in_output": _bool(serve.exclude_input_in_output),
        "cancellation_check_period_ms": str(CANCELLATION_CHECK_PERIOD_MS),
        "stream_interval": str(serve.stream_interval),
        **speculative_parameters(facts, speculative),
    }


def guided_decoding_parameters(serve: ServeSpec, *, tokenizer_dir: str, tokenizer_info_path: str) -> dict[str, str]:
    """TensorRT-LLM's guided-decoding parameters (both targets read the same names): the backend, the
    tokenizer-info file the C++ backend needs and the tokenizer_dir the Python backend needs
    (triton-inference-server/tensorrtllm_backend docs/guided_decoding.md). Nothing when serve.guided_decoding is none."""
    if serve.guided_decoding is GuidedDecodingBackend.none:
        return {}
    return {
        "guided_decoding_backend": serve.guided_decoding.value,
        "xgrammar_tokenizer_info_path": tokenizer_info_path,
        "tokenizer_dir": tokenizer_dir,
    }

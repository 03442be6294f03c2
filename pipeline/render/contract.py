"""The tensor contracts of the model repository, as data the templates iterate over.

TensorRT-LLM names live here (and in the templates), at the edge. Names follow the 1.2.x
templates: `seed` (was `random_seed`) and `min_tokens` (was `min_length`). Both `tensorrt_llm`
variants (the `tensorrtllm` C++ backend for the engine target, the Python model for the cpu
target) are rendered from `LLM_INPUTS` / `LLM_OUTPUTS`, so their names, dtypes and shapes are
the same by construction; the cpu model adds one output, `preceding_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass

LOGITS = "LOGITS"  # placeholder data type, resolved to the engine's logits dtype at render time
LORA_WEIGHTS = "LORA_WEIGHTS"  # placeholder data type, resolved to the engine's LoRA plugin dtype at render time

# Engine dtype names (config.json) → Triton data types.
TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton TYPE_* name, or LOGITS
    dims: tuple[int, ...]
    optional: bool = False
    scalar: bool = False  # dims [1] reshaped to [] (the backend sees one value per request)
    ragged: bool = False  # allow_ragged_batch

    def resolved(self, logits_datatype: str, lora_datatype: str | None = None) -> TensorSpec:
        placeholders = {LOGITS: logits_datatype, LORA_WEIGHTS: lora_datatype}
        if self.data_type not in placeholders:
            return self
        data_type = placeholders[self.data_type]
        if data_type is None:
            raise ValueError(f"tensor {self.name}: no data type for placeholder {self.data_type}")
        return TensorSpec(self.name, data_type, self.dims, self.optional, self.scalar, self.ragged)


def _scalar(name: str, data_type: str, *, optional: bool = True) -> TensorSpec:
    return TensorSpec(name, data_type, (1,), optional=optional, scalar=True)


LLM_INPUTS: tuple[TensorSpec, ...] = (
    # optional only so that a `stop` request can omit it; every generation request sends it
    TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
    TensorSpec("decoder_input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),  # encoder-decoder only
    _scalar("input_lengths", "TYPE_INT32", optional=False),
    _scalar("decoder_input_lengths", "TYPE_INT32"),
    _scalar("request_output_len", "TYPE_INT32", optional=False),
    _scalar("num_return_sequences", "TYPE_INT32"),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    TensorSpec("stop_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    TensorSpec("bad_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    TensorSpec("embedding_bias", "TYPE_FP32", (-1,), optional=True, ragged=True),  # [vocab], or empty
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("runtime_top_k", "TYPE_INT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("early_stopping", "TYPE_BOOL"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("min_tokens", "TYPE_INT32"),
    _scalar("seed", "TYPE_UINT64"),
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("return_context_logits", "TYPE_BOOL"),
    _scalar("return_generation_logits", "TYPE_BOOL"),
    _scalar("return_perf_metrics", "TYPE_BOOL"),
    _scalar("return_num_input_tokens", "TYPE_BOOL"),
    _scalar("return_num_output_tokens", "TYPE_BOOL"),
    _scalar("exclude_input_in_output", "TYPE_BOOL"),
    _scalar("stop", "TYPE_BOOL"),
    _scalar("streaming", "TYPE_BOOL"),
    TensorSpec("guided_decoding_guide_type", "TYPE_STRING", (1,), optional=True, ragged=True),
    TensorSpec("guided_decoding_guide", "TYPE_STRING", (1,), optional=True, ragged=True),
    _scalar("lookahead_window_size", "TYPE_INT32"),
    _scalar("lookahead_ngram_size", "TYPE_INT32"),
    _scalar("lookahead_verification_set_size", "TYPE_INT32"),
)

# Draft tokens of draft-target speculative decoding (NVIDIA's tensorrt_llm config declares them; the BLS sends them to a
# draft_tokens_external engine): the draft, its logits (use_draft_logits) and the acceptance threshold.
LLM_DRAFT_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("draft_input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
    TensorSpec("draft_logits", LOGITS, (-1, -1), optional=True),
    _scalar("draft_acceptance_threshold", "TYPE_FP32"),
)
# Inputs of tensorrt_llm_bls only (not the ensemble's): the draft length of a request, and whether the target accepts
# draft tokens by the draft's logits (rejection sampling) instead of by comparing tokens.
BLS_SPECULATIVE_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("num_draft_tokens", "TYPE_INT32", (1,), optional=True),
    TensorSpec("use_draft_logits", "TYPE_BOOL", (1,), optional=True),
)

# TensorRT-LLM 1.x per-request perf metrics (return_perf_metrics) and token counts
# (return_num_input_tokens / return_num_output_tokens): one value per response.
PERF_METRIC_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    TensorSpec("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    TensorSpec("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    TensorSpec("arrival_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("last_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("acceptance_rate", "TYPE_FP32", (1,)),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    TensorSpec("total_draft_tokens", "TYPE_INT32", (1,)),
)
TOKEN_COUNT_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("num_input_tokens", "TYPE_INT32", (1,)),
    TensorSpec("num_output_tokens", "TYPE_INT32", (1,)),
)

LLM_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("output_ids", "TYPE_INT32", (-1, -1)),
    TensorSpec("sequence_length", "TYPE_INT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    TensorSpec("context_logits", LOGITS, (-1, -1)),
    TensorSpec("generation_logits", LOGITS, (-1, -1, -1)),
    TensorSpec("batch_index", "TYPE_INT32", (1,)),
    TensorSpec("sequence_index", "TYPE_INT32", (1,)),
    *PERF_METRIC_OUTPUTS,
    *TOKEN_COUNT_OUTPUTS,
)

# LoRA (engine target, engine built with the LoRA plugin): NVIDIA's tensorrt_llm/config.pbtxt lora_* inputs. lora_weights holds each module/layer's
# flattened in/out matrices in the plugin's dtype, lora_config its (module_id, layer, rank) rows.
LLM_LORA_INPUTS: tuple[TensorSpec, ...] = (
    _scalar("lora_task_id", "TYPE_UINT64"),
    TensorSpec("lora_weights", LORA_WEIGHTS, (-1, -1), optional=True, ragged=True),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), optional=True, ragged=True),
)

# The cpu model's input addition: speculative decoding's draft length per request and how a draft model's tokens are
# accepted (TensorRT-LLM has both on the BLS model, `num_draft_tokens` / `use_draft_logits`; 0 turns speculation off,
# at most the engine's max_draft_len). The cpu engine drafts inside, so the BLS passes them on (refengine SamplingParams).
# `priority`: the request's scheduling priority in [0, 1], higher first, 0.5 when absent (TensorRT-LLM's executor
# Request priority; refengine/priority.py).
CPU_LLM_EXTRA_INPUTS: tuple[TensorSpec, ...] = (
    _scalar("num_draft_tokens", "TYPE_INT32"),
    _scalar("use_draft_logits", "TYPE_BOOL"),
    _scalar("priority", "TYPE_FP32"),
)

# The cpu model's addition: context tokens for incremental, UTF-8-safe detokenization.
CPU_LLM_EXTRA_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec("preceding_ids", "TYPE_INT32", (-1, -1)),)

# QUERY / REQUEST_OUTPUT_LEN and the client's text_input / max_tokens are required, but declared
# optional: Triton 2.51 checks an ensemble's required inputs only by count, so a request missing
# text_input but carrying `stream` would get an empty answer. Declared optional, the step runs
# and preprocessing refuses the request by name.
PREPROCESSING_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("QUERY", "TYPE_STRING", (1,), optional=True),
    TensorSpec("DECODER_QUERY", "TYPE_STRING", (1,), optional=True),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,), optional=True),
    TensorSpec("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,), optional=True),
    TensorSpec("END_ID", "TYPE_INT32", (1,), optional=True),
    TensorSpec("PAD_ID", "TYPE_INT32", (1,), optional=True),
)

PREPROCESSING_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("INPUT_ID", "TYPE_INT32", (-1,)),
    TensorSpec("DECODER_INPUT_ID", "TYPE_INT32", (-1,)),
    TensorSpec("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    TensorSpec("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", (1,)),
    TensorSpec("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)),
    TensorSpec("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    TensorSpec("EMBEDDING_BIAS", "TYPE_FP32", (-1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
    TensorSpec("OUT_END_ID", "TYPE_INT32", (1,)),
    TensorSpec("OUT_PAD_ID", "TYPE_INT32", (1,)),
)

POSTPROCESSING_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
    TensorSpec("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
    TensorSpec("PRECEDING_IDS", "TYPE_INT32", (-1, -1), optional=True),
)

POSTPROCESSING_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec("OUTPUT", "TYPE_STRING", (-1,)),)

CLIENT_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", (1,), optional=True),  # required: see PREPROCESSING_INPUTS
    TensorSpec("decoder_text_input", "TYPE_STRING", (1,), optional=True),
    TensorSpec("max_tokens", "TYPE_INT32", (1,), optional=True),
    TensorSpec("bad_words", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("stop_words", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("embedding_bias_words", "TYPE_STRING", (-1,), optional=True),
    TensorSpec("embedding_bias_weights", "TYPE_FP32", (-1,), optional=True),
    TensorSpec("end_id", "TYPE_INT32", (1,), optional=True),
    TensorSpec("pad_id", "TYPE_INT32", (1,), optional=True),
    TensorSpec("num_return_sequences", "TYPE_INT32", (1,), optional=True),
    TensorSpec("beam_width", "TYPE_INT32", (1,), optional=True),
    TensorSpec("temperature", "TYPE_FP32", (1,), optional=True),
    TensorSpec("top_k", "TYPE_INT32", (1,), optional=True),
    TensorSpec("top_p", "TYPE_FP32", (1,), optional=True),
    TensorSpec("length_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("repetition_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("presence_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("frequency_penalty", "TYPE_FP32", (1,), optional=True),
    TensorSpec("min_tokens", "TYPE_INT32", (1,), optional=True),
    TensorSpec("seed", "TYPE_UINT64", (1,), optional=True),
    TensorSpec("return_log_probs", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("return_context_logits", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("return_generation_logits", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("return_perf_metrics", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("guided_decoding_guide_type", "TYPE_STRING", (1,), optional=True, ragged=True),
    TensorSpec("guided_decoding_guide", "TYPE_STRING", (1,), optional=True, ragged=True),
)

# A request's priority (serve.traffic; pipeline/config/spec/traffic.py: in [0, 1], higher first), on the ensemble and
# BLS of a target whose LLM model takes one (the cpu model; NVIDIA's 1.2 tensorrt_llm config.pbtxt declares no priority
# input: triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt at NVIDIA/TensorRT-LLM 0c8de69),
# passed straight to it (PRIORITY_CLIENT_TO_LLM). Triton's own request priority is not carried into an ensemble's steps
# (triton-inference-server/server #7116), so it travels as a tensor.
CLIENT_PRIORITY_INPUTS: tuple[TensorSpec, ...] = (TensorSpec("priority", "TYPE_FP32", (1,), optional=True),)
PRIORITY_CLIENT_TO_LLM = {"priority": "priority"}

# The same LoRA inputs on the ensemble and BLS, passed straight to tensorrt_llm (LORA_CLIENT_TO_LLM).
CLIENT_LORA_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("lora_task_id", "TYPE_UINT64", (1,), optional=True),
    TensorSpec("lora_weights", LORA_WEIGHTS, (-1, -1), optional=True),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), optional=True),
)

CLIENT_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    TensorSpec("context_logits", LOGITS, (-1, -1)),
    TensorSpec("generation_logits", LOGITS, (-1, -1, -1)),
    TensorSpec("batch_index", "TYPE_INT32", (1,)),
    TensorSpec("sequence_index", "TYPE_INT32", (1,)),
    *PERF_METRIC_OUTPUTS,
    *TOKEN_COUNT_OUTPUTS,
)

# Ensemble wiring. Client input → preprocessing input.
CLIENT_TO_PREPROCESSING = {
    "text_input": "QUERY",
    "decoder_text_input": "DECODER_QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
}
# Preprocessing output → tensorrt_llm input.
PREPROCESSING_TO_LLM = {
    "INPUT_ID": "input_ids",
    "DECODER_INPUT_ID": "decoder_input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "REQUEST_DECODER_INPUT_LEN": "decoder_input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "BAD_WORDS_IDS": "bad_words_list",
    "STOP_WORDS_IDS": "stop_words_list",
    "EMBEDDING_BIAS": "embedding_bias",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
}
# Client input passed straight to tensorrt_llm.
CLIENT_TO_LLM = {
    "num_return_sequences": "num_return_sequences",
    "beam_width": "beam_width",
    "temperature": "temperature",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "min_tokens": "min_tokens",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "exclude_input_in_output": "exclude_input_in_output",
    "stream": "streaming",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
# LoRA client input → tensorrt_llm input (only in repositories of a LoRA engine).
LORA_CLIENT_TO_LLM = {"lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config"}
# tensorrt_llm output → client output (text_output comes from postprocessing).
LLM_TO_CLIENT = {
    "cum_log_probs": "cum_log_probs",
    "output_log_probs": "output_log_probs",
    "context_logits": "context_logits",
    "generation_logits": "generation_logits",
    "batch_index": "batch_index",
    "sequence_index": "sequence_index",
    **{spec.name: spec.name for spec in PERF_METRIC_OUTPUTS + TOKEN_COUNT_OUTPUTS},
}
# tensorrt_llm output → postprocessing input; `preceding_ids` only where the LLM model has it.
LLM_TO_POSTPROCESSING = {"output_ids": "TOKENS_BATCH", "sequence_length": "SEQUENCE_LENGTH"}
CPU_LLM_TO_POSTPROCESSING = {"preceding_ids": "PRECEDING_IDS"}

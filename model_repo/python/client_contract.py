"""How the BLS model wires client inputs through preprocessing → tensorrt_llm → postprocessing.

The same wiring as the ensemble's (rendered from `pipeline/render/contract.py`); a unit test
keeps the two equal. Pure, importable outside Triton.
"""

from __future__ import annotations

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

# Declared by repositories of a LoRA engine and by cpu repositories (whose tensorrt_llm refuses them by name);
# absent inputs are simply not forwarded.
LORA_CLIENT_TO_LLM = {"lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config"}

LLM_TO_CLIENT = {
    "cum_log_probs": "cum_log_probs",
    "output_log_probs": "output_log_probs",
    "context_logits": "context_logits",
    "generation_logits": "generation_logits",
    "batch_index": "batch_index",
    "sequence_index": "sequence_index",
    "kv_cache_alloc_new_blocks": "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks": "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks": "kv_cache_alloc_total_blocks",
    "arrival_time_ns": "arrival_time_ns",
    "first_scheduled_time_ns": "first_scheduled_time_ns",
    "first_token_time_ns": "first_token_time_ns",
    "last_token_time_ns": "last_token_time_ns",
    "acceptance_rate": "acceptance_rate",
    "total_accepted_draft_tokens": "total_accepted_draft_tokens",
    "total_draft_tokens": "total_draft_tokens",
    "num_input_tokens": "num_input_tokens",
    "num_output_tokens": "num_output_tokens",
}


# A request flag → the tensorrt_llm output that answers it (the BLS passes both through).
_FIGURE_OUTPUTS = {
    "return_perf_metrics": "kv_cache_alloc_new_blocks",
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
}


def figures_not_given(llm_inputs, tensors, requested) -> str | None:
    """The first flag the client set, whose output it asked for, that the LLM's response lacks."""
    for flag, output in _FIGURE_OUTPUTS.items():
        asked = flag in llm_inputs and bool(llm_inputs[flag].reshape(-1)[0]) and output in requested
        if asked and output not in tensors:
            return flag
    return None

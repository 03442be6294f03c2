"""trtllm-build's rules for an EAGLE-1/2 engine (--speculative_decoding_mode eagle) that the spec alone does not decide:
the base model, quantization, parallelism and the builder's own bounds. Facts from TensorRT-LLM 1.2:

  * EagleForCausalLM subclasses LLaMAForCausalLM and EagleConfig LLaMAConfig (tensorrt_llm/models/eagle/{model,config}.py);
    examples/eagle/convert_checkpoint.py reads the base with transformers' LlamaConfig. MODEL_MAP builds
    MistralForCausalLM as LLaMAForCausalLM too;
  * examples/eagle/README.md: support matrix FP16/BF16, tensor parallel, paged KV cache; "Pipeline parallelism is not
    supported" (convert_checkpoint.py asserts pp_size == 1). A quantized EAGLE engine comes only from ModelOpt's own
    EAGLE training (one checkpoint with hf_quant_config.json), not from a user's SafeAILab EAGLE checkpoint;
  * builder.py: EAGLE asserts max_batch_size <= 512 and max_draft_len <= 256, and turns paged context FMHA on.
"""

from __future__ import annotations

from pipeline.backends.engine.build_request import BuildRequest

EAGLE_BASES = ("LlamaForCausalLM", "MistralForCausalLM")
EAGLE_QUANT_ALGOS = ("none",)
EAGLE_MAX_BATCH_SIZE = 512
PAGED_CONTEXT_FMHA_REASON = "trtllm-build turns paged context FMHA on for an EAGLE engine (builder.py)"


def request_eagle_problems(s: BuildRequest) -> list[str]:
    return eagle_problems(
        architecture=s.architecture, quant_algo=s.quant_algo, kv_cache_quant=s.kv_cache_quant, pp_size=s.pp_size, max_batch_size=s.max_batch_size
    )


def eagle_problems(*, architecture: str, quant_algo: str, kv_cache_quant: str, pp_size: int, max_batch_size: int) -> list[str]:
    """Why trtllm-build cannot build this EAGLE-1/2 engine (empty: it can): spec facts, so `validate` reports them too."""
    problems = []
    if architecture not in EAGLE_BASES:
        problems.append(
            f"build.speculative.mode eagle needs a Llama-family model ({', '.join(EAGLE_BASES)}); the model is "
            f"{architecture}: TensorRT-LLM's EagleForCausalLM wraps only LLaMAForCausalLM"
        )
    if quant_algo not in EAGLE_QUANT_ALGOS or kv_cache_quant != "none":
        problems.append(
            f"build.speculative.mode eagle cannot be combined with quantize.algo {quant_algo} / quantize.kv_cache "
            f"{kv_cache_quant} on build.target engine: TensorRT-LLM's EAGLE example supports FP16/BF16 only "
            "(a quantized EAGLE engine needs ModelOpt's own EAGLE training); use quantize.algo none and "
            "quantize.kv_cache none"
        )
    if pp_size > 1:
        problems.append(
            f"build.speculative.mode eagle cannot be built with build.pp_size {pp_size}: TensorRT-LLM's EAGLE "
            "does not support pipeline parallelism (examples/eagle/README.md); use build.tp_size"
        )
    if max_batch_size > EAGLE_MAX_BATCH_SIZE:
        problems.append(
            f"build.max_batch_size ({max_batch_size}) exceeds {EAGLE_MAX_BATCH_SIZE} for build.speculative.mode "
            "eagle: trtllm-build asserts max_batch_size <= 512 for EAGLE (builder.py)"
        )
    return problems

#!/usr/bin/env bash
# trtllm-build for llama-3.1-8b-int4-awq: TensorRT-LLM 1.2.1, TensorRT 10.14.1.48, CUDA 13.0
# image: nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3 (tag inferred, verify the TensorRT-LLM version inside)
# rendered by trtllm-pipeline. --build_config is authoritative: with it trtllm-build
# ignores the size flags below, which repeat its values; plugin flags are overridden by its plugin_config.
# decisions (what differs from the build config, and why):
#   warning quantize.algo = int4_awq: no GPU declared: quantize.algo int4_awq / quantize.kv_cache none cannot be built for Blackwell (SM 10.x–11.x)
#   changed build.plugins.use_fp8_context_fmha true -> false: FP8 context FMHA needs quantize.algo fp8, w4a8_awq or nvfp4 (got int4_awq)
#   changed build.plugins.use_fused_mlp true -> false: the fused gate/up GEMM supports only unquantized or FP8 weights, not quantize.algo int4_awq
#   note plugin_config.weight_only_groupwise_quant_matmul_plugin = float16: set by trtllm-build for group-wise INT4
set -euo pipefail
trtllm-build \
  --checkpoint_dir /artifacts/llama-3.1-8b-int4-awq/quantize/trtllm_checkpoint \
  --output_dir /artifacts/llama-3.1-8b-int4-awq/build/engine \
  --build_config /artifacts/llama-3.1-8b-int4-awq/build/engine/build_config.json \
  --max_batch_size 32 \
  --max_input_len 4096 \
  --max_seq_len 8192 \
  --max_num_tokens 8192 \
  --max_beam_width 1 \
  --kv_cache_type paged \
  --tokens_per_block 32 \
  --gpt_attention_plugin auto \
  --gemm_plugin disable \
  --context_fmha enable \
  --use_paged_context_fmha enable \
  --use_fp8_context_fmha disable \
  --use_fused_mlp disable \
  --reduce_fusion disable \
  --multiple_profiles disable \
  --remove_input_padding enable \
  --output_timing_cache /artifacts/llama-3.1-8b-int4-awq/build/engine/model.cache \
  --workers 1 \
  --log_level info

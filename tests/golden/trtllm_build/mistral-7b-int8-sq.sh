#!/usr/bin/env bash
# trtllm-build for mistral-7b-int8-sq: TensorRT-LLM 1.2.1, TensorRT 10.14.1.48, CUDA 13.0
# image: nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3 (tag inferred, verify the TensorRT-LLM version inside)
# rendered by trtllm-pipeline. --build_config is authoritative: with it trtllm-build
# ignores the size flags below, which repeat its values; plugin flags are overridden by its plugin_config.
# decisions (what differs from the build config, and why):
#   warning quantize.algo = int8_sq: no GPU declared: quantize.algo int8_sq / quantize.kv_cache none cannot be built for Blackwell (SM 10.x–11.x)
#   changed build.plugins.use_fp8_context_fmha true -> false: FP8 context FMHA needs quantize.algo fp8, w4a8_awq or nvfp4 (got int8_sq)
#   changed build.plugins.use_fused_mlp true -> false: the fused gate/up GEMM supports only unquantized or FP8 weights, not quantize.algo int8_sq
set -euo pipefail
trtllm-build \
  --checkpoint_dir /artifacts/mistral-7b-int8-sq/quantize/trtllm_checkpoint \
  --output_dir /artifacts/mistral-7b-int8-sq/build/engine \
  --build_config /artifacts/mistral-7b-int8-sq/build/engine/build_config.json \
  --max_batch_size 64 \
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
  --output_timing_cache /artifacts/mistral-7b-int8-sq/build/engine/model.cache \
  --workers 1 \
  --log_level info

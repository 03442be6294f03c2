#!/usr/bin/env bash
# trtllm-build for mixtral-8x7b-fp8: TensorRT-LLM 1.2.1, TensorRT 10.14.1.48, CUDA 13.0
# image: nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3 (tag inferred, verify the TensorRT-LLM version inside)
# rendered by trtllm-pipeline. --build_config is authoritative: with it trtllm-build
# ignores the size flags below, which repeat its values; plugin flags are overridden by its plugin_config.
# decisions (what differs from the build config, and why):
#   warning quantize.algo = fp8: no GPU declared: quantize.algo fp8 / quantize.kv_cache fp8 need SM >= 89; declare the GPU to check before building
#   note build_config.strongly_typed = true: FP8 weights or an FP8 KV cache force a strongly typed network
set -euo pipefail
trtllm-build \
  --checkpoint_dir /artifacts/mixtral-8x7b-fp8/quantize/trtllm_checkpoint \
  --output_dir /artifacts/mixtral-8x7b-fp8/build/engine \
  --build_config /artifacts/mixtral-8x7b-fp8/build/engine/build_config.json \
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
  --use_fp8_context_fmha enable \
  --use_fused_mlp enable \
  --reduce_fusion disable \
  --multiple_profiles disable \
  --remove_input_padding enable \
  --output_timing_cache /artifacts/mixtral-8x7b-fp8/build/engine/model.cache \
  --workers 1 \
  --log_level info

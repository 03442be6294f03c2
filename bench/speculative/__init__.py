"""`trtllm-pipeline bench speculative CONFIG`: refengine's tokens/s with and without speculative
decoding (draft-target and n-gram), side by side in one run, at batch 1, 4 and 32."""

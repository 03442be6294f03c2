"""The KV blocks a sequence holds with sliding-window layers: refengine's one block table against per-window pools.

What refengine does: one block table per sequence serves every layer (each layer's KV tensor is indexed by the same
block ids, `model_runner.decoder.KVCacheLayout`), so a sequence of L tokens holds ⌈L / B⌉ blocks in every layer,
local or global. A sliding-window layer masks the keys outside its window (`attention.causal_attention`); their
slots stay allocated. Releasing the blocks that lie wholly outside every layer's window would only free anything
for a model whose layers are all windowed; every Gemma 2 / Gemma 3 model has global layers (Gemma 3: one in six),
which read the whole sequence, so such a release frees nothing for them and refengine does not implement it. The
capacity planner knows this (`pipeline.config.families.Family.runtime_windows`: refengine attends over whole
sequences).

What TensorRT-LLM does (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/batch_manager/kvCacheManager.h): its KV cache manager groups the layers by attention
window (Triton's `max_attention_window_size` vector, PyTorch's `kv_cache_config.max_attention_window`) and gives
each group its own block pool; a window-W layer keeps a sequence's last W tokens, so it holds the blocks covering
positions [L − W, L): at most ⌈W / B⌉ + 1. `layer_blocks_held` computes both figures.
"""

from __future__ import annotations

from collections.abc import Sequence


def layer_blocks_held(num_tokens: int, tokens_per_block: int, layer_windows: Sequence[int | None]) -> tuple[int, int]:
    """(refengine, per-window pools): Σ over layers of the blocks a sequence of `num_tokens` cached tokens holds in
    that layer; `layer_windows[i]` is layer i's window, None for global attention."""
    if num_tokens <= 0:
        return 0, 0
    whole = -(-num_tokens // tokens_per_block)
    pooled = 0
    for window in layer_windows:
        first = 0 if window is None else max(0, num_tokens - window) // tokens_per_block
        pooled += whole - first
    return whole * len(layer_windows), pooled

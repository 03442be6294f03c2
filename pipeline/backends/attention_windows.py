"""Per-layer attention windows as the runtimes take them: Triton's `max_attention_window_size` (a comma-separated
vector, one entry per layer) and the LLM API's `kv_cache_config.max_attention_window` (a list).

Sliding-window layers (Gemma 3's local layers, GPT-OSS's sliding layers) keep only their window's tokens in the
KV cache when the runtime is given the vector; without it every layer keeps the whole sequence (TensorRT-LLM 1.2
builds Gemma 3 engines with no window of their own: the window is a runtime setting, NVIDIA/TensorRT-LLM
examples/models/core/gemma/README.md, "Run Gemma 3"). Entries are capped at max_seq_len, as
TensorRT-LLM caps them itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def window_vector(layer_windows: Sequence[int | None], max_seq_len: int) -> list[int]:
    """One window per layer (None: the whole sequence), capped at max_seq_len; [] when no layer is windowed."""
    if not any(w is not None and w < max_seq_len for w in layer_windows):
        return []
    return [max_seq_len if w is None else min(w, max_seq_len) for w in layer_windows]


def checkpoint_layer_windows(pretrained: Mapping[str, Any]) -> tuple[int | None, ...]:
    """The windows a TensorRT-LLM checkpoint config records: Gemma 3's `sliding_window` on every layer but each
    `_sliding_window_pattern`-th (TensorRT-LLM's `is_local`); () for a checkpoint with no local layers."""
    window, pattern = pretrained.get("sliding_window"), pretrained.get("_sliding_window_pattern")
    if not window or not pattern:
        return ()
    layers = int(pretrained.get("num_hidden_layers") or 0)
    return tuple(None if (i + 1) % int(pattern) == 0 else int(window) for i in range(layers))

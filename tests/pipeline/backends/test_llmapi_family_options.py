"""The LLM() option a family changes on the llmapi target, read against TensorRT-LLM 1.2's PyTorch model classes.

The one family-dependent option the project renders is `kv_cache_config.max_attention_window` (llm_args.py
KvCacheConfig: Optional[List[PositiveInt]], one entry per layer, a shorter list repeats). For Gemma 3 it must say
what the model class computes: tensorrt_llm/_torch/models/modeling_gemma3.py's Gemma3DecoderLayer makes layer i
sliding when (i + 1) % sliding_window_pattern != 0, and Gemma3Attention then attends over config.sliding_window tokens
(its attention_window_size), the other layers over the whole sequence (max_seq_len). The expectation below is that
rule, restated; a family without local layers (Llama) gets no window option at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.backends.llmapi.options import build_options
from pipeline.config.loader import load_config
from tests.conftest import REPO

EXAMPLE = REPO / "build_configs" / "llama-3.1-8b-fp8-llmapi.yaml"


def _gemma3(directory: Path, *, layers: int, pattern: int, window: int) -> Path:
    directory.mkdir(parents=True)
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 4096, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "sliding_window": window,
        "sliding_window_pattern": pattern, "query_pre_attn_scalar": 64, "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _nvidia_gemma3_windows(layers: int, pattern: int, window: int, max_seq_len: int) -> list[int]:
    return [min(window, max_seq_len) if (i + 1) % pattern else max_seq_len for i in range(layers)]


def test_gemma3_windows_are_the_layers_gemma3decoderlayer_makes_sliding(tmp_path):
    model = _gemma3(tmp_path / "gemma3", layers=12, pattern=6, window=512)
    loaded = load_config(
        EXAMPLE, [f"model.source={model}", "build.max_seq_len=4096", "build.max_input_len=2048", "quantize.algo=none", "quantize.kv_cache=none"]
    )
    options = build_options(loaded.spec, loaded.model)
    windows = options["kv_cache_config"]["max_attention_window"]
    assert windows == _nvidia_gemma3_windows(12, 6, 512, 4096)
    assert windows.count(4096) == 2 and windows[5] == windows[11] == 4096  # the global layers 5 and 11


def test_a_family_without_local_layers_leaves_the_window_to_nvidia():
    loaded = load_config(EXAMPLE)
    assert "max_attention_window" not in build_options(loaded.spec, loaded.model).get("kv_cache_config", {})

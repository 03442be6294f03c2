from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "tiny-stdlib-llama"
BUILD_CONFIGS = REPO / "build_configs"

# Tests never touch the user's artifact store or home directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One intra-op thread for torch here and in the commands the tests start (set before anything imports torch). On a
# 2-core machine shared with other jobs, a second OpenMP thread mostly spin-waits for a core: the shipped draft's
# agreement test took 69-79 s with 2 threads and 7-23 s with 1 (interleaved runs, same load). An explicit
# OMP_NUM_THREADS in the environment wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# A minimal valid build config; its model lives in the directory "model" next to the YAML file.
MINIMAL_CONFIG = """\
name: demo
model:
  source: model
build:
  target: cpu
  max_input_len: 256
  max_seq_len: 512
  max_num_tokens: 1024
"""


def write_model_config(directory: Path, **overrides) -> Path:
    """A config-only Llama directory (enough for validation and planning)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
    }
    config.update(overrides)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def config_only_model(tmp_path: Path) -> Path:
    return write_model_config(tmp_path / "model")


@pytest.fixture
def python_executable() -> str:
    return sys.executable

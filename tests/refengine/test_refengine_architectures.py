"""The architecture table: every row names a loadable DecoderModel, no name is claimed twice, and
the table is importable without torch (the pipeline's validation reads it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from refengine import LLMEngine, ModelLoadError, load_checkpoint
from refengine.architectures import ARCHITECTURES, HF_MODEL_TYPES, architecture_for_checkpoint
from refengine.model_runner import KVCacheLayout, LlamaModel, load_model

PROTOCOL = ("from_checkpoint", "vocab_size", "kv_cache_layout", "forward", "compute_logits")


@pytest.mark.parametrize("row", ARCHITECTURES, ids=lambda row: row.family)
def test_each_row_names_a_decoder_model(row):
    model_class = row.load_model_class()
    assert [name for name in PROTOCOL if not hasattr(model_class, name)] == []
    assert all(architecture_for_checkpoint(name) is row for name in row.checkpoint_architectures)


def test_no_name_belongs_to_two_rows():
    checkpoint_names = [name for row in ARCHITECTURES for name in row.checkpoint_architectures]
    assert len(checkpoint_names) == len(set(checkpoint_names))
    assert len(HF_MODEL_TYPES) == len(set(HF_MODEL_TYPES))
    with pytest.raises(ModelLoadError, match="'FalconForCausalLM' is not supported by the reference engine"):
        architecture_for_checkpoint("FalconForCausalLM")


def test_load_model_builds_the_class_of_the_checkpoint_architecture(small_checkpoint):
    model = load_model(load_checkpoint(small_checkpoint))
    assert type(model) is LlamaModel
    assert model.kv_cache_layout == KVCacheLayout(2, 2, 8, torch.float32)
    caches = model.kv_cache_layout.allocate(num_blocks=3, tokens_per_block=4)
    assert [tuple(cache.shape) for cache in caches] == [(2, 3, 4, 2, 8)] * 2
    assert LLMEngine.from_checkpoint(small_checkpoint).vocab_size == model.vocab_size


def test_the_table_imports_without_torch():
    probe = "import sys, refengine.architectures; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'safetensors', 'numpy'}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr

"""The lean draft path (refengine/speculative/lean_draft.py) computes what the engine's general path computes:
the same logits within float rounding, for prompts, multi-token feeds after a rollback and batched decode steps,
on fbgemm's fp16-weight GEMM and on float32 GEMMs, grouped-query and plain multi-head attention."""

from __future__ import annotations

import pytest
import torch

from refengine import load_checkpoint
from refengine.model_runner import build_attention_metadata, load_model
from refengine.model_runner.packed_linear import fp16_gemm_available
from refengine.speculative.lean_draft import lean_draft_of

TOKENS_PER_BLOCK = 4
SEQUENCES = [[3, 17, 9, 40, 2, 2, 8, 51, 11], [5, 6, 7], [60, 1, 33, 33, 33, 12, 4]]


def _general_logits(model, kv_caches, feeds):
    """Logits of each feed's last token on the engine's paged path (block table: the sequence's index × 8 + blocks)."""
    tables = [[index * 8 + block for block in range(8)] for index in range(len(SEQUENCES))]
    metadata = build_attention_metadata(
        [len(tokens) for _, tokens, _ in feeds], [start for _, _, start in feeds], [tables[slot] for slot, _, _ in feeds], TOKENS_PER_BLOCK
    )
    ids = torch.tensor([t for _, tokens, _ in feeds for t in tokens])
    hidden = model.forward(ids, kv_caches, metadata, last_token_of=list(range(len(feeds))))
    return model.compute_logits(hidden)


@pytest.mark.parametrize("fp16_gemm", [True, False], ids=["fp16-gemm", "fp32-gemm"])
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@torch.inference_mode()
def test_lean_logits_equal_the_general_paths(tmp_path, checkpoint_writer, fp16_gemm, kv_heads):
    model = load_model(load_checkpoint(checkpoint_writer(tmp_path / "draft", seed=5, num_key_value_heads=kv_heads)))
    lean = lean_draft_of(model, len(SEQUENCES), 32, None, fp16_gemm=fp16_gemm)
    assert lean is not None
    assert all(linear.uses_fp16_gemm == (fp16_gemm and fp16_gemm_available()) for layer in lean.layers for linear in layer[1:3] + layer[4:])
    kv_caches = model.kv_cache_layout.allocate(8 * len(SEQUENCES), TOKENS_PER_BLOCK)
    steps = [
        [(slot, tokens[:-2], 0) for slot, tokens in enumerate(SEQUENCES)],  # prompts, batched
        [(slot, tokens[-2:], len(tokens) - 2) for slot, tokens in enumerate(SEQUENCES)],  # two tokens each
        [(0, [44], len(SEQUENCES[0])), (2, [45], len(SEQUENCES[2]))],  # decode steps, one token each, two slots
        [(1, [46], len(SEQUENCES[1]))],  # one sequence
        [(0, [47, 48, 49], len(SEQUENCES[0]) - 1)],  # after a rollback of one token: positions overwritten
    ]
    for feeds in steps:
        torch.testing.assert_close(lean.forward(feeds), _general_logits(model, kv_caches, feeds), rtol=1e-4, atol=1e-4)

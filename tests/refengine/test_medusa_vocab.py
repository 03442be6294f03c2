"""Medusa heads proposing only the first M token ids (`refengine_speculative.medusa_vocab_size`): cheaper heads, the
same greedy output (the target verifies every node), and bad values refused by field."""

from __future__ import annotations

import json

import pytest
import torch

from refengine import EngineConfigError, LLMEngine, SamplingParams, write_engine_dir
from refengine.speculative.medusa_files import write_medusa_engine
from refengine.speculative.medusa_heads import MedusaHeads
from tests.refengine.test_medusa import HEADS, HIDDEN, MC_LIKE, PROMPTS, VOCAB, _close_heads

CUT = VOCAB // 2
FIELD = "refengine_speculative.medusa_vocab_size"
BUILD = {"max_batch_size": 4, "max_input_len": 48, "max_seq_len": 96, "max_num_tokens": 96, "plugin_config": {"tokens_per_block": 4}}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, checkpoint_writer):
    root = tmp_path_factory.mktemp("medusa-vocab")
    target_dir = checkpoint_writer(root / "target", seed=3, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2)
    return {"root": root, "target": target_dir, "heads": _close_heads(root / "heads", target_dir)}


def _engine_dir(dirs, name: str, medusa_vocab_size):
    engine_dir = write_engine_dir(dirs["target"], dirs["root"] / name, BUILD, "test")
    write_medusa_engine(engine_dir, dirs["heads"], MC_LIKE)
    config = json.loads((engine_dir / "config.json").read_text())
    config["refengine_speculative"]["medusa_vocab_size"] = medusa_vocab_size
    (engine_dir / "config.json").write_text(json.dumps(config))
    return engine_dir


def test_cut_heads_propose_only_the_first_token_ids():
    generator = torch.Generator().manual_seed(0)
    layers = [[(torch.randn(HIDDEN, HIDDEN, generator=generator), torch.randn(HIDDEN, generator=generator))] for _ in range(HEADS)]
    projections = [torch.randn(VOCAB, HIDDEN, generator=generator) for _ in range(HEADS)]
    hidden = torch.randn(5, HIDDEN, generator=generator)
    full = MedusaHeads(layers, projections).top_tokens(hidden, (VOCAB,) * HEADS)
    cut = MedusaHeads(layers, projections, vocab_size=CUT).top_tokens(hidden, (CUT,) * HEADS)
    for full_row, cut_row in zip(full, cut):
        for full_ids, cut_ids in zip(full_row, cut_row):
            assert cut_ids == [token for token in full_ids if token < CUT]  # the same ranking, restricted to ids < M


def test_greedy_medusa_with_a_cut_vocabulary_equals_plain_greedy(dirs):
    params = SamplingParams(max_tokens=16, temperature=0)
    plain = LLMEngine.from_engine_dir(write_engine_dir(dirs["target"], dirs["root"] / "plain", BUILD, "test"))
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params)]
    engine = LLMEngine.from_engine_dir(_engine_dir(dirs, "cut", CUT))
    assert engine._speculator.drafter.heads.vocab_size == CUT
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)] == expected
    assert engine.stats().num_accepted_draft_tokens > 0


@pytest.mark.parametrize("value", [0, -3, "512", True, VOCAB + 1])
def test_bad_medusa_vocab_sizes_are_refused_by_field(dirs, value):
    engine_dir = _engine_dir(dirs, f"bad-{value}", value)
    with pytest.raises(EngineConfigError) as error:
        LLMEngine.from_engine_dir(engine_dir)
    assert error.value.field == FIELD
    assert str(value) in str(error.value)


def test_fused_first_layers_compute_each_head_as_written():
    """x_0 = x; x_{l+1} = x_l + SiLU(W_l x_l + b_l); logits = W_lm x_L, for heads of two residual layers."""
    generator = torch.Generator().manual_seed(1)
    layers = [[(torch.randn(HIDDEN, HIDDEN, generator=generator) / 8, torch.randn(HIDDEN, generator=generator)) for _ in range(2)] for _ in range(HEADS)]
    projections = [torch.randn(VOCAB, HIDDEN, generator=generator) for _ in range(HEADS)]
    hidden = torch.randn(3, HIDDEN, generator=generator)
    expected = []
    for head in range(HEADS):
        x = hidden
        for weight, bias in layers[head]:
            x = x + torch.nn.functional.silu(x @ weight.T + bias)
        expected.append(torch.topk(x @ projections[head].T, 3, dim=-1).indices.tolist())
    proposals = MedusaHeads(layers, projections).top_tokens(hidden, (3,) * HEADS)
    assert [[row[head] for row in proposals] for head in range(HEADS)] == expected

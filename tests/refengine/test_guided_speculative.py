"""Guided decoding with speculative drafts: the grammar masks every draft position the target scores,
a draft ends at the first token the grammar refuses, and greedy guided + speculative answers exactly
what greedy guided decoding answers (n-gram drafts and draft models, related to the target or not)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import xgrammar as xgr

from refengine import EngineConfig, LLMEngine, SamplingParams, load_checkpoint
from refengine.guided.drafts import constrain_draft
from refengine.guided.params import GuidedDecodingParams
from refengine.model_runner import load_model
from refengine.speculative.draft_model import DraftModelDrafter
from refengine.speculative.ngram import NGramDrafter
from refengine.speculative.planner import Draft
from tests.refengine.test_refengine_guided import EOS, VOCAB, VOCAB_SIZE, _text

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "tags", "n"],
}
REGEX = r"(ab|cd){2,6}-[0-9]{2}"
PROMPTS = [[5, 6, 7, 5, 6, 7], [40, 41, 42, 43, 44], [3, 4]]
CONFIG = EngineConfig(max_seq_len=160, max_input_len=16, num_kv_blocks=256, tokens_per_block=4, max_num_tokens=64)


def _info():
    return xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[EOS])


class FixedDrafter:
    """Proposes the same tokens at every step (a token neither grammar ever allows)."""

    def __init__(self, token_ids: tuple[int, ...]) -> None:
        self.token_ids = token_ids
        self.proposed = 0

    def propose(self, requests):
        self.proposed += len(requests)
        return {r.seq_id: Draft(self.token_ids[: r.num_draft_tokens]) for r in requests}

    def release(self, seq_ids) -> None:
        pass


@pytest.fixture(scope="module")
def models(checkpoint_writer, tmp_path_factory):
    root = tmp_path_factory.mktemp("guided_spec")
    target = load_model(load_checkpoint(checkpoint_writer(root / "target", vocab_size=VOCAB_SIZE)))
    other = load_model(load_checkpoint(checkpoint_writer(root / "other", seed=11, vocab_size=VOCAB_SIZE, num_hidden_layers=1)))
    plain = LLMEngine(target, CONFIG)
    plain.enable_guided_decoding(_info())
    return {"target": target, "other": other, "plain": plain}


def _engine(models, kind: str) -> LLMEngine:
    if kind == "ngram":
        drafter = NGramDrafter(2)
    elif kind == "violating":
        drafter = FixedDrafter((VOCAB.index("<x3>"),) * 4)
    else:  # "target": a draft that is the target (drafting under the grammar); "other": an unrelated model
        drafter = DraftModelDrafter(models[kind], num_blocks=256, tokens_per_block=CONFIG.tokens_per_block)
    engine = LLMEngine(models["target"], CONFIG.replace(max_draft_len=4), drafter)
    engine.enable_guided_decoding(_info())
    return engine


def _params(temperature: float = 0.0, **extra) -> list[SamplingParams]:
    guides = [GuidedDecodingParams("json_schema", json.dumps(SCHEMA)), GuidedDecodingParams("regex", REGEX)]
    return [SamplingParams(max_tokens=120, temperature=temperature, guided_decoding=guide, **extra) for guide in guides for _ in PROMPTS]


def _check_valid(outputs) -> None:
    for index, output in enumerate(outputs):
        completion = output.outputs[0]
        text = _text(completion.token_ids)
        assert completion.finish_reason == "stop", text
        if index < len(PROMPTS):
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert re.fullmatch(REGEX, text), text


@pytest.mark.parametrize("kind", ["ngram", "target", "other", "violating"])
def test_greedy_guided_speculation_equals_greedy_guided_decoding(models, kind):
    params = _params()
    plain = models["plain"].generate(PROMPTS * 2, params)
    engine = _engine(models, kind)
    speculative = engine.generate(PROMPTS * 2, params)
    assert [o.outputs[0].token_ids for o in speculative] == [o.outputs[0].token_ids for o in plain]
    assert [o.outputs[0].finish_reason for o in speculative] == [o.outputs[0].finish_reason for o in plain]
    _check_valid(speculative)
    stats = engine.stats()
    if kind == "violating":  # every draft cut at its first token: nothing was ever verified
        assert engine._speculator.drafter.proposed > 0 and stats.num_draft_tokens == 0
    else:
        assert stats.num_draft_tokens > 0 and stats.num_accepted_draft_tokens > 0
    if kind == "target":  # the draft model drafts under the grammar too: the target's own masked argmax
        assert stats.num_accepted_draft_tokens == stats.num_draft_tokens
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_sampled_guided_speculation_stays_valid(models):
    engine = _engine(models, "other")
    outputs = engine.generate(PROMPTS * 2, _params(temperature=1.0, seed=7))
    _check_valid(outputs)
    assert engine.stats().num_draft_tokens > 0


def test_a_draft_ends_at_the_first_token_the_grammar_refuses_and_the_state_is_kept(models):
    state = models["plain"].guided_decoder.new_state(GuidedDecodingParams("regex", "ab[0-9]"))
    a, b, seven, z = VOCAB.index("a"), VOCAB.index("b"), VOCAB.index("7"), VOCAB.index("z")
    kept, masks = constrain_draft(state, [a, b, z, seven])
    assert kept == 2 and masks.shape == (2, VOCAB_SIZE)
    assert bool(masks[0][b]) and not bool(masks[0][seven]) and bool(masks[1][seven]) and not bool(masks[1][z])
    assert state.accepts(a) and not state.accepts(b)  # rolled back: still at the start
    assert constrain_draft(state, [a, b, seven, EOS])[0] == 3  # a drafted stop token ends the draft
    assert constrain_draft(state, [z]) == (0, None)

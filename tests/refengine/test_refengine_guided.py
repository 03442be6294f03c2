"""Guided decoding in the reference engine: a random model, whose unguided output is noise, writes
JSON that validates against the schema, text matching the regex, words of the grammar."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import xgrammar as xgr

from refengine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from refengine.guided.params import MAX_GUIDE_BYTES, GuidedDecodingParams

VOCAB_SIZE = 128
EOS = 1
# A raw vocabulary: every printable ASCII character plus JSON-ish pieces, padded to the model's size.
VOCAB = ["<unk>", "</s>"] + [chr(c) for c in range(32, 127)]
VOCAB += ['{"', '":', '",', '"}', "true", "false", "null", "12", "00", "ab", "cd", "name", "age", "tags", "[]", "],"]
VOCAB += [f"<x{i}>" for i in range(VOCAB_SIZE - len(VOCAB))]

SCHEMAS = {
    "nested-object-enum-range": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
            "nickname": {"type": "string", "maxLength": 6},
        },
        "required": ["name", "age", "address", "tags"],
    },
    "array-of-numbers": {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4},
    "boolean-or-null": {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok", "note"]},
}


@pytest.fixture(scope="module")
def engine(checkpoint_writer, tmp_path_factory) -> LLMEngine:
    checkpoint = checkpoint_writer(tmp_path_factory.mktemp("guided_ckpt"), vocab_size=VOCAB_SIZE)
    engine = LLMEngine.from_checkpoint(checkpoint, EngineConfig(max_seq_len=256, max_input_len=16, num_kv_blocks=512, tokens_per_block=4, max_beam_width=4))
    engine.enable_guided_decoding(xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[EOS]), cache_size=4)
    return engine


def _text(token_ids) -> str:
    return "".join(VOCAB[token_id] for token_id in token_ids)


def _guided(guide_type: str, guide: str = "", **params) -> SamplingParams:
    return SamplingParams(guided_decoding=GuidedDecodingParams(guide_type, guide), **{"max_tokens": 200, **params})


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_output_validates_against_its_schema_greedy_and_sampled(engine, name):
    schema = SCHEMAS[name]
    prompts = [[5, 6, 7], [40, 41, 42, 43, 44]]
    greedy = _guided("json_schema", json.dumps(schema), temperature=0.0)
    sampled = _guided("json_schema", json.dumps(schema), temperature=1.0, seed=11, n=3)
    outputs = engine.generate(prompts + prompts, [greedy, greedy, sampled, sampled])
    completions = [c for output in outputs for c in output.outputs]
    assert len(completions) == 2 + 6
    for completion in completions:
        assert completion.finish_reason == "stop", _text(completion.token_ids)
        jsonschema.validate(json.loads(_text(completion.token_ids)), schema)
    assert EOS not in [t for c in completions for t in c.token_ids]  # the stop token ends it, unseen
    sampled_texts = {_text(c.token_ids) for output in outputs[2:] for c in output.outputs}
    assert len(sampled_texts) > 1  # n > 1: the forked samples are independent


def test_unguided_output_of_the_same_model_is_not_json(engine):
    [output] = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=30, temperature=0.0))
    with pytest.raises(ValueError):
        json.loads(_text(output.outputs[0].token_ids))


def test_json_regex_and_grammar_guides(engine):
    outputs = engine.generate(
        [[3, 4]] * 3,
        [
            _guided("json", temperature=0.7, seed=1, max_tokens=60),
            _guided("regex", r"[a-c]{2,5}-[0-9]{3}", temperature=1.0, seed=2),
            _guided("ebnf_grammar", 'root ::= "yes" | "no" | "maybe " [0-9]', temperature=1.0, seed=3),
        ],
    )
    json_text, regex_text, grammar_text = (_text(o.outputs[0].token_ids) for o in outputs)
    if outputs[0].outputs[0].finish_reason == "stop":
        json.loads(json_text)
    assert re.fullmatch(r"[a-c]{2,5}-[0-9]{3}", regex_text) and outputs[1].outputs[0].finish_reason == "stop"
    assert re.fullmatch(r"yes|no|maybe [0-9]", grammar_text) and outputs[2].outputs[0].finish_reason == "stop"


def test_max_tokens_before_the_grammar_completes_is_length_never_stop(engine):
    schema = json.dumps(SCHEMAS["nested-object-enum-range"])
    [output] = engine.generate([[5, 6, 7]], _guided("json_schema", schema, temperature=0.0, max_tokens=6))
    completion = output.outputs[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 6
    with pytest.raises(ValueError):
        json.loads(_text(completion.token_ids))


def test_preemption_keeps_the_grammar_state(checkpoint_writer, tmp_path_factory, engine):
    """Recompute keeps the accepted tokens, so a preempted guided sequence ends as an unpreempted one."""
    schema = json.dumps(SCHEMAS["array-of-numbers"])
    params = _guided("json_schema", schema, temperature=1.0, seed=5, max_tokens=40)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    alone = [engine.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    checkpoint = checkpoint_writer(tmp_path_factory.mktemp("guided_small_kv"), vocab_size=VOCAB_SIZE)
    tight = LLMEngine.from_checkpoint(
        checkpoint, EngineConfig(max_seq_len=64, max_input_len=16, num_kv_blocks=12, tokens_per_block=4, scheduler_policy="max_utilization")
    )
    tight.enable_guided_decoding(xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[EOS]))
    together = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert tight.scheduler.num_preemptions > 0
    assert together == alone


def test_compiles_are_cached_per_distinct_guide_in_a_bounded_lru(engine):
    before = engine.guided_decoder.stats()
    for _ in range(3):
        engine.generate([[3, 4]], _guided("regex", "[0-9]{3}", max_tokens=5))
    for index in range(6):  # more distinct guides than the cache holds (4)
        engine.generate([[3, 4]], _guided("regex", f"x{index}[0-9]", max_tokens=4))
    after = engine.guided_decoder.stats()
    assert after.num_cache_hits - before.num_cache_hits >= 2
    assert after.num_cached == 4 and after.compile_seconds > 0 and after.num_masks > before.num_masks


def test_grammar_state_hooks_for_beams_and_speculation(engine):
    state = engine.guided_decoder.new_state(GuidedDecodingParams("regex", "ab[0-9]"))
    a, b, seven = VOCAB.index("a"), VOCAB.index("b"), VOCAB.index("7")
    assert state.accepts(a) and not state.accepts(b)
    assert state.accept(a) and state.accept(b)
    fork = state.fork()
    state.rollback(1)  # a rejected draft token is undone
    assert state.accepts(b) and not state.accepts(seven)
    assert fork.accepts(seven) and fork.accept(seven) and fork.allows_only_stop()
    assert not state.accept(seven)  # refused: the state is unchanged


@pytest.mark.parametrize(
    "guide_type, guide, field, reason",
    [
        ("json_schema", '{"type": "object", "properties": {', "guided_decoding_guide", "not valid JSON"),
        ("json_schema", '{"type": "nope"}', "guided_decoding_guide", "not a valid JSON schema at type: 'nope'"),
        ("json_schema", '{"type": 5}', "guided_decoding_guide", "not a valid JSON schema at type"),
        ("json_schema", '{"type": "object", "properties": {"a": {"not": {"type": "string"}}}}', "guided_decoding_guide", "'not' (at #/properties/a)"),
        ("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}', "guided_decoding_guide", "xgrammar cannot compile"),
        ("regex", "(unclosed", "guided_decoding_guide", "parenthesis is not closed"),
        ("regex", "\u00e9\u00e9", "guided_decoding_guide", "accepts no output"),
        ("ebnf_grammar", "root ::= undefined_rule", "guided_decoding_guide", 'Rule "undefined_rule" is not defined'),
        ("ebnf_grammar", 'root ::= ""', "guided_decoding_guide", "accepts only the empty output"),
        ("json_schema", "", "guided_decoding_guide", "needs a guide"),
        ("xml", "<a/>", "guided_decoding_guide_type", "unknown guide type 'xml'"),
        ("json_schema", '{"enum": ["' + "a" * MAX_GUIDE_BYTES + '"]}', "guided_decoding_guide", "at most 65536 bytes"),
    ],
    ids=[
        "invalid-json",
        "unsupported-type",
        "invalid-schema",
        "unsupported-keyword",
        "empty-range",
        "bad-regex",
        "regex-outside-vocab",
        "undefined-rule",
        "empty-grammar",
        "no-guide",
        "unknown-type",
        "too-big",
    ],
)
def test_bad_guides_are_refused_by_field_before_any_token(engine, guide_type, guide, field, reason):
    with pytest.raises(InvalidRequestError) as raised:
        engine.add_request([3, 4], SamplingParams(guided_decoding=GuidedDecodingParams(guide_type, guide)))
    assert raised.value.field == field and reason in str(raised.value)
    assert not engine.has_unfinished()


def test_a_guide_on_an_engine_without_guided_decoding_is_refused(small_checkpoint):
    plain = LLMEngine.from_checkpoint(small_checkpoint)
    with pytest.raises(InvalidRequestError, match="guided_decoding_guide_type: guided decoding is off"):
        plain.add_request([3, 4], _guided("json"))


def test_the_grammar_wins_when_other_processors_ban_every_token_it_allows(engine):
    """bad_words bans the one token the grammar allows next: the grammar's token is drawn anyway."""
    b = VOCAB.index("b")
    [output] = engine.generate([[3, 4]], _guided("regex", "ab", temperature=0.0, bad_words=[[b]], max_tokens=8))
    assert _text(output.outputs[0].token_ids) == "ab" and output.outputs[0].finish_reason == "stop"


# -- guided beams: every beam carries its own grammar state through reassignment ------------------
@pytest.mark.parametrize("name", ["nested-object-enum-range", "array-of-numbers"])
def test_every_returned_beam_validates_against_its_schema(engine, name):
    schema = SCHEMAS[name]
    params = _guided("json_schema", json.dumps(schema), beam_width=4, n=4, end_id=EOS)
    outputs = engine.generate([[5, 6, 7], [40, 41, 42, 43, 44]], params)
    for output in outputs:
        assert len(output.outputs) == 4
        texts = [_text(c.token_ids) for c in output.outputs]
        assert len(set(texts)) == 4, texts  # four different beams, not one copied
        for completion, text in zip(output.outputs, texts):
            assert completion.finish_reason == "stop", text
            jsonschema.validate(json.loads(text), schema)
        scores = [c.cum_log_prob for c in output.outputs]
        assert all(s > -1e8 for s in scores), scores


def test_a_grammar_with_fewer_answers_than_beams_returns_only_valid_beams(engine):
    """Two answers, four beams, no end_id (the grammar's stop token ends a beam): the two best are the
    two answers; the rest are the placeholder beams (score -1e9, as Hugging Face's), valid too."""
    [output] = engine.generate([[3, 4]], _guided("ebnf_grammar", 'root ::= "yes" | "no"', beam_width=4, n=4))
    texts = [_text(c.token_ids) for c in output.outputs]
    assert {texts[0], texts[1]} == {"yes", "no"} and set(texts) == {"yes", "no"}
    assert all(c.finish_reason == "stop" for c in output.outputs)
    assert [c.cum_log_prob > -1e8 for c in output.outputs] == [True, True, False, False]

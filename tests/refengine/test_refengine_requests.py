"""Bad inputs are refused with an error naming the field and value, the engine keeps serving;
aborts free blocks in the same step; end_id, stop sequences, bad words, min_tokens, logprobs."""

from __future__ import annotations

import pytest

from refengine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams

VOCAB = 64
CONFIG = EngineConfig(
    max_batch_size=4,
    max_input_len=16,
    max_seq_len=32,
    max_num_tokens=64,
    tokens_per_block=4,
    num_kv_blocks=16,
    max_num_samples=2,
    max_logprobs=5,
)
PROMPT = [5, 9, 13, 2, 40, 7]


@pytest.fixture()
def engine(small_checkpoint):
    return LLMEngine.from_checkpoint(small_checkpoint, CONFIG)


@pytest.fixture(scope="module")
def greedy_alone(small_checkpoint):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG)
    return engine.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0))[0].outputs[0].token_ids


@pytest.mark.parametrize(
    ("field", "kwargs", "message"),
    [
        ("max_tokens", {"max_tokens": 0}, "must be >= 1, got 0"),
        ("max_tokens", {"max_tokens": -3}, "must be >= 1, got -3"),
        ("max_tokens", {"max_tokens": 2.5}, "must be an integer, got 2.5"),
        ("top_p", {"top_p": 0.0}, r"must be in \(0, 1\], got 0.0"),
        ("top_p", {"top_p": 1.5}, r"must be in \(0, 1\], got 1.5"),
        ("top_p", {"top_p": -0.2}, r"must be in \(0, 1\], got -0.2"),
        ("temperature", {"temperature": -0.5}, "must be between 0 and 100, got -0.5"),
        ("temperature", {"temperature": float("nan")}, "must be a finite number"),
        ("temperature", {"temperature": 1e30}, "must be between 0 and 100, got 1e[+]30"),
        ("pad_id", {"pad_id": -1}, "must be >= 0, got -1"),
        ("top_k", {"top_k": -1}, "must be >= 0, got -1"),
        ("seed", {"seed": -7}, "must be >= 0, got -7"),
        ("repetition_penalty", {"repetition_penalty": 0.0}, "must be > 0, got 0.0"),
        ("min_tokens", {"min_tokens": 5, "max_tokens": 3}, "5 exceeds max_tokens 3"),
        ("n", {"n": 0}, "must be >= 1, got 0"),
        ("logprobs", {"logprobs": -1}, "must be >= 0, got -1"),
        ("stop_token_ids", {"stop_token_ids": [[]]}, "contains an empty token sequence"),
        ("bad_words", {"bad_words": [[1, -2]]}, "token id -2"),
        ("end_id", {"end_id": True}, "must be an integer, got True"),
    ],
)
def test_sampling_params_are_validated(field, kwargs, message):
    with pytest.raises(InvalidRequestError, match=f"^{field}: {message}") as error:
        SamplingParams(**kwargs)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("prompt", "params", "field", "message"),
    [
        ([], SamplingParams(), "prompt_token_ids", "is empty"),
        ("hello", SamplingParams(), "prompt_token_ids", "got a string"),
        (None, SamplingParams(), "prompt_token_ids", "got NoneType"),
        ([1] * 17, SamplingParams(), "prompt_token_ids", "prompt length 17 exceeds max_input_len 16"),
        ([1, 64, 2], SamplingParams(), "prompt_token_ids", r"token id 64 at index 1 is outside the vocabulary \[0, 64\)"),
        ([1, -1], SamplingParams(), "prompt_token_ids", "token id -1 at index 1"),
        ([1, 2.0], SamplingParams(), "prompt_token_ids", r"item 1 \(2.0\) is not an integer"),
        ([1] * 10, SamplingParams(max_tokens=23), "max_tokens", "prompt length 10 \\+ max_tokens 23 = 33 exceeds max_seq_len 32"),
        ([1], SamplingParams(end_id=64), "end_id", "token id 64 is outside the vocabulary"),
        ([1], SamplingParams(pad_id=64), "pad_id", "token id 64 is outside the vocabulary"),
        ([1], SamplingParams(stop_token_ids=[[3, 99]]), "stop_token_ids", "token id 99"),
        ([1], SamplingParams(bad_words=[[70]]), "bad_words", "token id 70"),
        ([1], SamplingParams(n=3), "n", "3 exceeds the engine's max_num_samples 2"),
        ([1], SamplingParams(logprobs=6), "logprobs", "6 exceeds the engine's max_logprobs 5"),
        ([1], "greedy", "sampling_params", "must be SamplingParams"),
    ],
)
def test_bad_requests_are_refused_and_the_engine_keeps_serving(engine, greedy_alone, prompt, params, field, message):
    good = engine.add_request(PROMPT, SamplingParams(max_tokens=10, temperature=0))
    engine.step()  # the good request is running
    with pytest.raises(InvalidRequestError, match=f"^{field}: .*{message}") as error:
        engine.add_request(prompt, params)
    assert error.value.field == field
    final = None
    while engine.has_unfinished():
        for output in engine.step():
            assert output.request_id == good
            final = output
    assert final.outputs[0].token_ids == greedy_alone


def test_request_that_could_never_fit_the_cache_is_refused(small_checkpoint):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG.replace(num_kv_blocks=3))
    with pytest.raises(InvalidRequestError, match="^max_tokens: .*needs 4 KV-cache blocks of 4 tokens, but the cache has only 3"):
        engine.add_request([1] * 6, SamplingParams(max_tokens=10))
    with pytest.raises(InvalidRequestError, match="^n: .*guaranteed_no_evict"):
        engine.add_request([1] * 4, SamplingParams(max_tokens=4, n=2))


def test_prompt_longer_than_token_budget_needs_chunking(small_checkpoint):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG.replace(max_num_tokens=8))
    with pytest.raises(InvalidRequestError, match="exceeds max_num_tokens 8 and enable_chunked_context is off"):
        engine.add_request([1] * 9)
    chunked = LLMEngine.from_checkpoint(small_checkpoint, CONFIG.replace(max_num_tokens=8, enable_chunked_context=True))
    chunked.add_request([1] * 9)


def test_duplicate_request_id(engine):
    engine.add_request(PROMPT, request_id="same")
    with pytest.raises(InvalidRequestError, match="^request_id: 'same' is already in use"):
        engine.add_request(PROMPT, request_id="same")


def test_abort_frees_blocks_in_the_same_step(engine):
    request_id = engine.add_request(PROMPT, SamplingParams(max_tokens=10, temperature=0))
    other = engine.add_request([3, 4], SamplingParams(max_tokens=10, temperature=0))
    engine.step()
    used_before = engine.kv_cache_usage().num_used_blocks
    assert used_before == 2 + 1  # prompts of 6 and 2 tokens in blocks of 4 (blocks come as needed)
    engine.abort(request_id)
    assert engine.kv_cache_usage().num_used_blocks == 1  # only the other request's block remains
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs[request_id].finished
    assert outputs[request_id].outputs[0].finish_reason == "aborted"
    assert not outputs[other].finished
    engine.abort(request_id)  # already finished: no-op
    engine.abort("no-such-request")  # unknown: no-op
    while engine.has_unfinished():
        engine.step()
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_abort_of_a_waiting_request(engine):
    request_id = engine.add_request(PROMPT)
    engine.abort(request_id)
    [output] = engine.step()
    assert output.outputs[0].finish_reason == "aborted" and output.outputs[0].token_ids == ()
    assert not engine.has_unfinished()


def test_end_id_ends_the_sequence_and_is_not_returned(engine, greedy_alone):
    position = 3
    end_id = greedy_alone[position]
    cut = greedy_alone.index(end_id)
    [output] = engine.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0, end_id=end_id))
    assert output.outputs[0].token_ids == greedy_alone[:cut]
    assert output.outputs[0].finish_reason == "stop"


def test_min_tokens_masks_end_id(engine, greedy_alone):
    end_id = greedy_alone[0]
    params = SamplingParams(max_tokens=10, temperature=0, end_id=end_id, min_tokens=4)
    [output] = engine.generate([PROMPT], params)
    tokens = output.outputs[0].token_ids
    assert len(tokens) >= 4 and end_id not in tokens[:4]


def test_stop_sequence_is_kept_in_the_output(engine, greedy_alone):
    stop = tuple(greedy_alone[2:4])
    [output] = engine.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[stop]))
    tokens = output.outputs[0].token_ids
    assert output.outputs[0].finish_reason == "stop"
    assert tokens[-2:] == stop and len(tokens) <= 4


def test_bad_words_are_never_produced(engine, greedy_alone):
    banned = greedy_alone[0]
    [output] = engine.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0, bad_words=[[banned]]))
    assert banned not in output.outputs[0].token_ids


def test_logprobs(engine, greedy_alone):
    [output] = engine.generate([PROMPT], SamplingParams(max_tokens=5, temperature=0, logprobs=3))
    completion = output.outputs[0]
    assert completion.token_ids == greedy_alone[:5]
    assert len(completion.logprobs) == 5
    for token_id, entry in zip(completion.token_ids, completion.logprobs):
        assert entry.token_id == token_id and entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0] == (token_id, pytest.approx(entry.logprob))  # greedy = most likely
        values = [value for _, value in entry.top_logprobs]
        assert values == sorted(values, reverse=True)


def test_streaming_deltas_add_up(engine, greedy_alone):
    outputs = list(engine.stream(PROMPT, SamplingParams(max_tokens=10, temperature=0)))
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    assert sum((o.outputs[0].new_token_ids for o in outputs), ()) == greedy_alone


def test_closing_a_stream_early_aborts_it(engine):
    stream = engine.stream(PROMPT, SamplingParams(max_tokens=10, temperature=0))
    next(stream)
    stream.close()
    assert engine.kv_cache_usage().num_used_blocks == 0
    assert not engine.has_unfinished()


def test_generate_refuses_all_if_one_prompt_is_bad(engine):
    with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
        engine.generate([PROMPT, []], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished()
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_limits_are_inclusive(engine):
    """TensorRT-LLM semantics: a prompt of exactly max_input_len tokens is served, and
    prompt + max_tokens may reach max_seq_len exactly."""
    [output] = engine.generate([[1] * 16], SamplingParams(max_tokens=16, temperature=0))
    assert len(output.outputs[0].token_ids) == 16

"""`return_context_logits` / `return_generation_logits`: the raw logits TensorRT-LLM's
`context_logits` and `generation_logits` carry (what prompt log-probs and top-N log-probs of the
OpenAI front end are computed from)."""

from __future__ import annotations

import random

import pytest
import torch

from refengine import EngineConfig, LLMEngine, SamplingParams
from refengine.errors import InvalidRequestError
from refengine.scoring import score_sequences

TOKENS_PER_BLOCK = 4


@pytest.fixture(scope="module")
def engine(tiny_model):
    config = EngineConfig(tokens_per_block=TOKENS_PER_BLOCK, max_num_tokens=16, enable_chunked_context=True, enable_prefix_caching=True)
    return LLMEngine.from_checkpoint(tiny_model("llama_gqa").checkpoint_dir, config)


def _prompt(length: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


def test_context_logits_are_the_teacher_forced_scores_of_every_prompt_position(engine):
    prompt = _prompt(37)  # chunked: max_num_tokens 16
    params = SamplingParams(max_tokens=2, temperature=0, return_context_logits=True)
    [output] = engine.generate([prompt], params)
    assert output.context_logits.shape == (37, engine.vocab_size)
    logprobs = torch.log_softmax(output.context_logits, dim=-1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
    [expected] = score_sequences(engine._model, [prompt])
    assert torch.allclose(logprobs, expected.token_logprobs, atol=1e-4)
    # The last row is what the first output token was drawn from (greedy: its argmax).
    assert int(output.context_logits[-1].argmax()) == output.outputs[0].token_ids[0]


def test_a_cached_prefix_is_not_reused_when_every_position_is_wanted(engine):
    prompt = _prompt(24, seed=9)
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0))  # caches the prompt's blocks
    reused_before = engine.stats().num_prompt_tokens_reused
    [output] = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0, return_context_logits=True))
    assert engine.stats().num_prompt_tokens_reused == reused_before
    assert output.context_logits.shape[0] == 24 and output.metrics.kv_reused_blocks == 0


def test_generation_logits_stream_one_row_per_new_token_and_match_logprobs(engine):
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=4, logprobs=0, return_generation_logits=True, return_context_logits=True)
    rows, tokens, logprobs, contexts = [], [], [], []
    for output in engine.stream(_prompt(11), params):
        completion = output.outputs[0]
        assert completion.new_generation_logits.shape[0] == len(completion.new_token_ids)
        rows.append(completion.new_generation_logits)
        tokens.extend(completion.new_token_ids)
        logprobs = [sample.logprob for sample in completion.logprobs]
        contexts.append(output.context_logits)
    logits = torch.cat(rows)
    assert logits.shape == (5, engine.vocab_size)
    drawn = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert torch.allclose(drawn, torch.tensor(logprobs), atol=1e-5)
    assert all(context is not None and context.shape[0] == 11 for context in contexts)  # complete from the first output on
    assert torch.allclose(contexts[0][-1], logits[0], atol=1e-4)


def test_logit_flags_must_be_booleans():
    with pytest.raises(InvalidRequestError, match="return_context_logits"):
        SamplingParams(return_context_logits=1)


def test_a_recomputed_chunk_does_not_count_twice_towards_complete_context_logits():
    from refengine.request_state import RequestState

    state = RequestState("r", tuple(range(32)), SamplingParams(return_context_logits=True), [])
    rows = torch.ones((16, 8))
    state.add_context_logits(0, rows)
    state.add_context_logits(0, rows)  # the same chunk again, after a preemption
    assert state._complete_context_logits() is None
    state.add_context_logits(16, rows * 2)
    assert state._complete_context_logits().shape == (32, 8)

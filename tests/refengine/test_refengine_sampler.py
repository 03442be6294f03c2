"""The sampler's filters and penalties against transformers' logits processors; seeded draws."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refengine import SamplingParams
from refengine.model_runner.sampler import Sampler, apply_logit_processors, filter_top_k_top_p
from refengine.step_messages import ScheduledSequence


def _item(params, history=(), num_output_tokens=0, seq_id=0, num_samples=1, seed=0, position=5):
    return ScheduledSequence(
        seq_id=seq_id,
        new_token_ids=(1,),
        num_computed_tokens=position - 1,
        block_table=(0,),
        num_samples=num_samples,
        sampling_params=params,
        sampling_seed=seed,
        first_sample_index=0,
        num_output_tokens=num_output_tokens,
        token_history=tuple(history),
    )


logit_rows = st.integers(0, 2**16).map(lambda seed: torch.randn(50, generator=torch.Generator().manual_seed(seed)) * 3)


@settings(max_examples=40, deadline=None)
@given(logit_rows, st.integers(1, 50), st.floats(0.05, 1.0))
def test_top_k_top_p_match_transformers(logits, top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    expected = TopPLogitsWarper(top_p, min_tokens_to_keep=1)(None, TopKLogitsWarper(top_k)(None, logits[None]))[0]
    actual = filter_top_k_top_p(logits, top_k, top_p)
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))


@settings(max_examples=40, deadline=None)
@given(logit_rows, st.lists(st.integers(0, 49), min_size=1, max_size=20), st.floats(0.5, 2.5))
def test_repetition_penalty_matches_transformers(logits, history, penalty):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([history]), logits[None].clone())[0]
    actual = apply_logit_processors(logits, _item(SamplingParams(repetition_penalty=penalty), history))
    torch.testing.assert_close(actual, expected)


def test_presence_and_frequency_penalties():
    logits = torch.zeros(6)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_logit_processors(logits, _item(params, history=[2, 2, 2, 4]))
    assert out.tolist() == [0, 0, -0.5 - 0.75, 0, -0.5 - 0.25, 0]


def test_multi_token_bad_word_needs_its_prefix():
    logits = torch.zeros(6)
    params = SamplingParams(bad_words=[[1, 2, 3]])
    assert apply_logit_processors(logits, _item(params, history=[0, 1, 2]))[3] == -math.inf
    assert apply_logit_processors(logits, _item(params, history=[0, 2, 2]))[3] == 0


def test_greedy_is_argmax_and_top_k_one_is_greedy():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0]] * 2)
    items = [_item(SamplingParams(temperature=0), seq_id=0), _item(SamplingParams(top_k=1), seq_id=1)]
    sampled = Sampler().sample(logits, items)
    assert sampled[0][0].token_id == 1 and sampled[1][0].token_id == 1


def test_seeded_draws_are_reproducible_and_follow_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log()[None]
    sampler = Sampler()
    counts = torch.zeros(4)
    for seed in range(2000):
        item = _item(SamplingParams(temperature=1.0), seed=seed)
        first = sampler.sample(logits, [item])[0][0].token_id
        assert sampler.sample(logits, [item])[0][0].token_id == first
        counts[first] += 1
    assert torch.allclose(counts / counts.sum(), probs, atol=0.04)


def test_several_samples_from_one_row_differ():
    logits = torch.zeros(1, 1000)
    [samples] = Sampler().sample(logits, [_item(SamplingParams(temperature=1.0), num_samples=4)]).values()
    assert len({s.token_id for s in samples}) > 1


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_sharpens_or_flattens(temperature):
    logits = torch.tensor([2.0, 0.0])[None]
    counts = 0
    for seed in range(400):
        item = _item(SamplingParams(temperature=temperature), seed=seed)
        counts += Sampler().sample(logits, [item])[0][0].token_id == 0
    expected = torch.softmax(torch.tensor([2.0, 0.0]) / temperature, dim=0)[0].item()
    assert abs(counts / 400 - expected) < 0.07

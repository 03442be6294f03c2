"""stream_interval (TensorRT-LLM's LLM API option): a request is reported on its first decoding step, on every
stream_interval-th one after and when it finishes; the tokens of the steps between come with the next report."""

from __future__ import annotations

import random

import pytest

from refengine import EngineConfig, EngineConfigError, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=11, temperature=0)


@pytest.fixture(scope="module")
def checkpoint_dir(tiny_model):
    return tiny_model("llama_gqa").checkpoint_dir


@pytest.fixture(scope="module")
def prompt():
    rng = random.Random(3)
    return [rng.randrange(256) for _ in range(21)]


def _reports(checkpoint_dir, prompt, interval, **config):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8, stream_interval=interval, **config))
    return [output.outputs[0].new_token_ids for output in engine.stream(prompt, GREEDY)]


@pytest.mark.parametrize("interval", [2, 4, 16])
def test_reports_come_on_the_first_and_every_nth_step_with_the_same_tokens(checkpoint_dir, prompt, interval):
    every_step = _reports(checkpoint_dir, prompt, 1)
    assert [len(ids) for ids in every_step] == [1] * 11
    reports = _reports(checkpoint_dir, prompt, interval)
    reported_steps = [step for step in range(1, 12) if step == 1 or step % interval == 0 or step == 11]
    assert [len(ids) for ids in reports] == [b - a for a, b in zip([0, *reported_steps], reported_steps)]
    assert [t for ids in reports for t in ids] == [t for ids in every_step for t in ids]


def test_chunked_prefill_steps_are_not_reported_between_intervals(checkpoint_dir, prompt):
    reports = _reports(checkpoint_dir, prompt, 3, enable_chunked_context=True, max_num_tokens=8)
    assert all(reports) and [t for ids in reports for t in ids] == [t for ids in _reports(checkpoint_dir, prompt, 1) for t in ids]


def test_non_streamed_generate_is_unchanged(checkpoint_dir, prompt):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8, stream_interval=5))
    [output] = engine.generate([prompt], GREEDY)
    assert output.outputs[0].token_ids == tuple(t for ids in _reports(checkpoint_dir, prompt, 1) for t in ids)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_interval_is_refused_by_name(bad):
    with pytest.raises(EngineConfigError, match="stream_interval"):
        EngineConfig(stream_interval=bad)

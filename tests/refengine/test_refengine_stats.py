"""`LLMEngine.stats()`: the cumulative counters the Triton model publishes as metrics."""

from __future__ import annotations

import random

import pytest

from refengine import EngineConfig, EngineStats, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def checkpoint_dir(tiny_model):
    return tiny_model("llama_gqa").checkpoint_dir


@pytest.fixture(scope="module")
def prompt():
    rng = random.Random(11)
    return [rng.randrange(256) for _ in range(23)]


def test_a_fresh_engine_counts_nothing(checkpoint_dir):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=4))
    assert engine.stats() == EngineStats()


def test_tokens_of_one_greedy_request(checkpoint_dir, prompt):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=4))
    [output] = engine.generate([prompt], GREEDY)
    stats = engine.stats()
    assert stats.num_generated_tokens == len(output.outputs[0].token_ids) == 12
    assert stats.num_prompt_tokens_computed == len(prompt)
    assert stats.num_prompt_tokens_reused == 0 and stats.num_prefix_cache_hits == 0
    assert stats.num_preemptions == 0
    assert stats.num_steps == 12  # one prefill step that samples the first token, then 11 decodes


def test_every_sample_of_n_counts(checkpoint_dir, prompt):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=4))
    engine.generate([prompt], SamplingParams(max_tokens=5, temperature=0, n=3))
    stats = engine.stats()
    assert stats.num_generated_tokens == 15
    assert stats.num_prompt_tokens_computed == len(prompt)  # the samples share the prompt


def test_prefix_reuse_is_counted_once_per_admission(checkpoint_dir, prompt):
    config = EngineConfig(tokens_per_block=4, enable_prefix_caching=True)
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    engine.generate([prompt], GREEDY)
    first = engine.stats()
    engine.generate([prompt], GREEDY)
    second = engine.stats()
    reused = (len(prompt) - 1) // 4 * 4  # full blocks, leaving the last token to compute
    assert (first.num_prefix_cache_hits, first.num_prompt_tokens_reused) == (0, 0)
    assert second.num_prefix_cache_hits == 1
    assert second.num_prompt_tokens_reused == reused
    assert second.num_prompt_tokens_computed - first.num_prompt_tokens_computed == len(prompt) - reused
    assert second.num_generated_tokens == 24


def test_preemptions_and_recomputed_prompts(checkpoint_dir):
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(10, 40))] for _ in range(16)]
    config = EngineConfig(
        tokens_per_block=4,
        max_batch_size=16,
        max_num_tokens=256,
        num_kv_blocks=40,
        scheduler_policy="max_utilization",
        enable_chunked_context=True,
    )
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    engine.generate(prompts, GREEDY)
    stats = engine.stats()
    assert stats.num_preemptions == engine.scheduler.num_preemptions > 0
    assert stats.num_prompt_tokens_computed > sum(map(len, prompts))  # preempted prompts recomputed
    assert stats.num_generated_tokens == 12 * len(prompts)

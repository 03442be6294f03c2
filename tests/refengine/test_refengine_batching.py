"""A request's output does not depend on what it is batched with, how its prompt is chunked,
whether it was preempted and recomputed, or whether its prefix came from the cache."""

from __future__ import annotations

import random

import pytest

from refengine import EngineConfig, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def checkpoint_dir(tiny_model):
    return tiny_model("llama_gqa").checkpoint_dir


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(7)
    target = [rng.randrange(256) for _ in range(23)]
    others = [[rng.randrange(256) for _ in range(rng.randint(1, 60))] for _ in range(31)]
    return target, others


@pytest.fixture(scope="module")
def alone(checkpoint_dir, prompts):
    """The target request run alone, with roomy default settings."""
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8))
    [output] = engine.generate([prompts[0]], GREEDY)
    return output.outputs[0].token_ids


def _run_batch(engine, target, others, params=GREEDY):
    batch = others[:15] + [target] + others[15:]
    outputs = engine.generate(batch, params)
    return outputs[15].outputs[0].token_ids, outputs


def test_alone_matches_transformers(tiny_model, hf_greedy_fn, prompts, alone):
    assert alone == hf_greedy_fn(tiny_model("llama_gqa").hf_model, prompts[0], 12)


def test_batched_with_31_others(checkpoint_dir, prompts, alone):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8, max_batch_size=32, max_num_tokens=2048))
    target_output, _ = _run_batch(engine, *prompts)
    assert target_output == alone


def test_chunked_prefill_with_small_token_budget(checkpoint_dir, prompts, alone):
    config = EngineConfig(tokens_per_block=4, max_batch_size=32, max_num_tokens=7, enable_chunked_context=True)
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    target_output, _ = _run_batch(engine, *prompts)
    assert target_output == alone


def test_preemption_and_recompute(checkpoint_dir, prompts, alone):
    config = EngineConfig(
        tokens_per_block=4,
        max_batch_size=32,
        max_num_tokens=256,
        num_kv_blocks=40,
        scheduler_policy="max_utilization",
        enable_chunked_context=True,
    )
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    target_output, outputs = _run_batch(engine, *prompts)
    assert engine.scheduler.num_preemptions > 0
    assert target_output == alone
    assert all(len(o.outputs[0].token_ids) == 12 for o in outputs)
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_guaranteed_no_evict_never_preempts(checkpoint_dir, prompts, alone):
    config = EngineConfig(tokens_per_block=4, max_batch_size=32, max_num_tokens=256, num_kv_blocks=40)
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    target_output, _ = _run_batch(engine, *prompts)
    assert engine.scheduler.num_preemptions == 0
    assert target_output == alone


def test_prefix_reuse(checkpoint_dir, prompts, alone):
    target, others = prompts
    config = EngineConfig(tokens_per_block=4, max_batch_size=8, enable_prefix_caching=True)
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    [first] = engine.generate([target], GREEDY)
    assert engine.scheduler.num_prefix_cache_hit_tokens == 0
    sharing = [target[:17] + other[:5] for other in others[:3]]  # share 4 full blocks
    outputs = engine.generate([target] + sharing, GREEDY)
    assert engine.scheduler.num_prefix_cache_hit_tokens >= 20 + 3 * 16
    assert first.outputs[0].token_ids == alone
    assert outputs[0].outputs[0].token_ids == alone
    fresh = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=4))
    assert [o.outputs[0].token_ids for o in fresh.generate(sharing, GREEDY)] == [o.outputs[0].token_ids for o in outputs[1:]]


def test_prefix_reuse_of_a_whole_block_aligned_prompt(checkpoint_dir, prompts):
    """Every block of the prompt is cached; the last token must still be computed for logits."""
    aligned = prompts[0][:20]
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=4, enable_prefix_caching=True))
    first = engine.generate([aligned], GREEDY)[0].outputs[0].token_ids
    second = engine.generate([aligned], GREEDY)[0].outputs[0].token_ids
    assert engine.scheduler.num_prefix_cache_hit_tokens == 16
    assert first == second


def test_greedy_samples_of_one_prompt_are_identical(checkpoint_dir, prompts, alone):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8))
    [output] = engine.generate([prompts[0]], SamplingParams(max_tokens=12, temperature=0, n=3))
    assert [c.token_ids for c in output.outputs] == [alone] * 3
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_forked_samples_survive_copy_on_write_and_recompute(checkpoint_dir, prompts):
    """n samples share the prompt blocks (the last one partly filled: copy-on-write). Running
    them again with a tiny pool, where they are preempted and recomputed without sharing, must
    give the same tokens: a wrong copy would show up as a different continuation."""
    target = prompts[0]  # 23 tokens: the last block of 8 is partly filled
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=1234, n=3)
    roomy = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8))
    [shared] = roomy.generate([target], params)
    tiny_pool = EngineConfig(
        tokens_per_block=8,
        num_kv_blocks=6,
        scheduler_policy="max_utilization",
        enable_chunked_context=True,
    )
    cramped = LLMEngine.from_checkpoint(checkpoint_dir, tiny_pool)
    [recomputed] = cramped.generate([target], params)
    assert cramped.scheduler.num_preemptions > 0
    assert [c.token_ids for c in shared.outputs] == [c.token_ids for c in recomputed.outputs]
    assert len({c.token_ids for c in shared.outputs}) > 1  # the samples really differ


def test_seeded_sampling_is_reproducible_and_batch_independent(checkpoint_dir, prompts):
    target, others = prompts
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=99)
    alone_engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8))
    [alone_output] = alone_engine.generate([target], params)
    batch_engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=8, max_batch_size=32, max_num_tokens=2048))
    target_output, _ = _run_batch(batch_engine, target, others, params)
    assert target_output == alone_output.outputs[0].token_ids

"""`RequestOutput.metrics`: TensorRT-LLM's per-request perf metrics, from refengine's own clock and
KV-cache manager (what the `tensorrt_llm` model returns for `return_perf_metrics`)."""

from __future__ import annotations

import random
import time

import pytest

from refengine import EngineConfig, LLMEngine, SamplingParams

TOKENS_PER_BLOCK = 4


@pytest.fixture(scope="module")
def checkpoint_dir(tiny_model):
    return tiny_model("llama_gqa").checkpoint_dir


def _prompt(length: int, seed: int = 5) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


def _blocks(tokens: int) -> int:
    return -(-tokens // TOKENS_PER_BLOCK)


def test_times_are_ordered_and_blocks_cover_the_sequence(checkpoint_dir):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=TOKENS_PER_BLOCK))
    before = time.time_ns()
    [output] = engine.generate([_prompt(23)], SamplingParams(max_tokens=9, temperature=0, end_id=None))
    after = time.time_ns()
    metrics = output.metrics
    assert before <= metrics.arrival_time_ns <= metrics.first_scheduled_time_ns <= metrics.first_token_time_ns
    assert metrics.first_token_time_ns < metrics.last_token_time_ns <= after  # 9 tokens: at least two steps
    # The last token is sampled but never written to the cache: 23 + 9 - 1 slots.
    assert (metrics.kv_new_blocks, metrics.kv_reused_blocks) == (_blocks(23 + 9 - 1), 0)
    assert metrics.kv_total_blocks == metrics.kv_new_blocks


def test_a_repeated_prompt_reuses_its_full_blocks_from_the_prefix_cache(checkpoint_dir):
    config = EngineConfig(tokens_per_block=TOKENS_PER_BLOCK, enable_prefix_caching=True)
    engine = LLMEngine.from_checkpoint(checkpoint_dir, config)
    prompt = _prompt(22)
    params = SamplingParams(max_tokens=3, temperature=0, end_id=None)
    [first] = engine.generate([prompt], params)
    [second] = engine.generate([prompt], params)
    full_blocks = 22 // TOKENS_PER_BLOCK  # the last prompt token is always recomputed: 5 of 5.5 blocks
    assert first.metrics.kv_reused_blocks == 0
    assert second.metrics.kv_reused_blocks == full_blocks
    assert second.metrics.kv_total_blocks == first.metrics.kv_total_blocks == _blocks(22 + 3 - 1)
    assert second.metrics.kv_new_blocks == first.metrics.kv_new_blocks - full_blocks


def test_forked_samples_count_their_copy_on_write_blocks(checkpoint_dir):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=TOKENS_PER_BLOCK))
    one = engine.generate([_prompt(10)], SamplingParams(max_tokens=4, temperature=1.0, seed=3, end_id=None))[0]
    two = engine.generate([_prompt(10)], SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=3, end_id=None))[0]
    # The second sample shares the prompt's blocks and copies the partly filled last one, then
    # grows on its own: more blocks than one sample, fewer than two independent requests.
    assert one.metrics.kv_new_blocks < two.metrics.kv_new_blocks < 2 * one.metrics.kv_new_blocks


def test_counts_are_dropped_when_a_request_ends_or_is_aborted(checkpoint_dir):
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=TOKENS_PER_BLOCK))
    request_id = engine.add_request(_prompt(30), SamplingParams(max_tokens=50, temperature=0, end_id=None))
    engine.step()
    kv = engine.scheduler.kv_cache
    assert kv.blocks_given(request_id)[0] == _blocks(30)
    engine.abort(request_id)
    [aborted] = [o for o in engine.step() if o.request_id == request_id]
    assert aborted.metrics.kv_new_blocks == _blocks(30) and aborted.outputs[0].finish_reason == "aborted"
    assert kv.blocks_given(request_id) == (0, 0)
    engine.generate([_prompt(5)], SamplingParams(max_tokens=2, temperature=0, end_id=None))
    assert not kv._given  # nothing kept for finished requests


def test_a_logit_bias_steers_greedy_decoding(checkpoint_dir):
    """`logit_bias` (TensorRT-LLM's embedding_bias) is added before everything else."""
    engine = LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(tokens_per_block=TOKENS_PER_BLOCK))
    prompt = _prompt(12)
    [plain] = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0, end_id=None))
    first = plain.outputs[0].token_ids[0]
    [banned] = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0, end_id=None, logit_bias=((first, -1e4),)))
    assert first not in banned.outputs[0].token_ids
    [forced] = engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0, end_id=None, logit_bias=((77, 1e4),)))
    assert forced.outputs[0].token_ids == (77, 77, 77)

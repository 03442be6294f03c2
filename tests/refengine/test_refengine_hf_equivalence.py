"""Greedy output of the reference engine equals transformers' greedy output, token for token."""

from __future__ import annotations

import random

from refengine import EngineConfig, LLMEngine, SamplingParams

MAX_NEW_TOKENS = 16


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(length)] for length in (1, 6, 19, 41)]


def test_greedy_matches_transformers(tiny_model, hf_greedy_fn, any_model_name):
    name = any_model_name
    model = tiny_model(name)
    engine = LLMEngine.from_checkpoint(model.checkpoint_dir, EngineConfig(tokens_per_block=8, max_num_tokens=128, max_batch_size=8))
    prompts = _prompts(seed=len(name))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0))
    for prompt, output in zip(prompts, outputs):
        expected = hf_greedy_fn(model.hf_model, prompt, MAX_NEW_TOKENS)
        assert output.outputs[0].token_ids == expected, f"prompt of length {len(prompt)}"
        assert output.outputs[0].finish_reason == "length"


def test_repetition_penalty_matches_transformers(tiny_model):
    import torch

    model = tiny_model("llama_gqa")
    engine = LLMEngine.from_checkpoint(model.checkpoint_dir, EngineConfig(tokens_per_block=8))
    prompt = _prompts(seed=3)[2]
    params = SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.7)
    [output] = engine.generate([prompt], params)
    with torch.no_grad():
        expected = model.hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
            repetition_penalty=1.7,
        )[0, len(prompt) :].tolist()
    assert output.outputs[0].token_ids == tuple(expected)

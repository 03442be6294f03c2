"""`bench engine CONFIG --kv-sharing`: KV blocks that beams and parallel samples share (#15).

On the engine's own limits (prefix caching off, so a block counts only while a sequence holds it),
one prompt of `prompt_len` random tokens, `max_tokens` new tokens (no end id: every sequence runs
to its length), side by side in one process:

- beam search, `beam_width` beams (all returned) vs `beam_width` independent greedy requests of
  the same prompt, submitted together;
- n = `beam_width` sampling (one request, forked after its prompt) vs `beam_width` independent
  sampled requests of the same prompt (seeds seed, seed + 1, ...): the no-sharing count.

Each run reports the peak of KV blocks in use over its steps (and its wall time); with the
blocks a sequence of prompt + max_tokens needs alone and how many beams / samples differ (so
that sharing is not the trivial sharing of identical sequences).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from refengine import LLMEngine, SamplingParams


def run_kv_sharing(engine_dir: Path, *, beam_width: int = 4, prompt_len: int = 100, max_tokens: int = 64, seed: int = 0) -> dict[str, Any]:
    torch.set_num_threads(1)  # as the engine benchmark: tiny matmuls on shared cores
    engine = LLMEngine.from_engine_dir(engine_dir, enable_prefix_caching=False)
    if engine.config.max_beam_width < beam_width:
        raise ValueError(f"bench engine --kv-sharing runs {beam_width} beams: the engine was built with max_beam_width {engine.config.max_beam_width}")
    rng = random.Random(seed)
    prompt = [rng.randrange(3, engine.vocab_size) for _ in range(prompt_len)]
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0)
    sampled = SamplingParams(max_tokens=max_tokens, temperature=1.0, top_k=50, seed=seed)
    runs = {
        "beam_search": _peak(engine, [(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, beam_width=beam_width, n=beam_width))]),
        "independent_greedy": _peak(engine, [(prompt, greedy)] * beam_width),
        "parallel_sampling": _peak(engine, [(prompt, SamplingParams(**{**_fields(sampled), "n": beam_width}))]),
        "independent_sampling": _peak(engine, [(prompt, SamplingParams(**{**_fields(sampled), "seed": seed + i})) for i in range(beam_width)]),
    }
    beams = runs["beam_search"].pop("outputs")[0].outputs
    distinct_samples = len({c.token_ids for c in runs["parallel_sampling"]["outputs"][0].outputs})
    for run in runs.values():
        run.pop("outputs", None)
    blocks_alone = -(-(prompt_len + max_tokens) // engine.config.tokens_per_block)
    return {
        "recipe": {
            "beam_width": beam_width,
            "prompt_len": prompt_len,
            "max_tokens": max_tokens,
            "seed": seed,
            "tokens_per_block": engine.config.tokens_per_block,
        },
        "blocks_per_sequence_alone": blocks_alone,
        "runs": runs,
        "beam_vs_greedy_blocks": round(runs["independent_greedy"]["peak_blocks"] / runs["beam_search"]["peak_blocks"], 2),
        "sampling_vs_independent_blocks": round(runs["independent_sampling"]["peak_blocks"] / runs["parallel_sampling"]["peak_blocks"], 2),
        "distinct_beams": len({c.token_ids for c in beams}),
        "distinct_parallel_samples": distinct_samples,
    }


def _fields(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in ("max_tokens", "temperature", "top_k", "seed")}


def _peak(engine: LLMEngine, requests) -> dict[str, Any]:
    started = time.perf_counter()
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    peak, finals = 0, {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
        peak = max(peak, engine.kv_cache_usage().num_used_blocks)
    return {"peak_blocks": peak, "wall_s": round(time.perf_counter() - started, 3), "outputs": [finals[i] for i in ids]}

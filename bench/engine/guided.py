"""`bench engine --guided`: the cost of guided decoding (xgrammar) in refengine, side by side.

In one process and one sitting, on the built engine: the same prompts decoded unguided and under a
JSON schema, at batch 1 (requests one after another) and at batch B (all at once, B = the engine's
max_batch_size capped at 32), interleaved over `rounds` (each figure is its best round: the machine
is shared). Reported: ms per generated token, wall clock and process CPU time (with one torch thread
the CPU time is the work done, which other jobs disturb far less), and guided/unguided × of each,
the mask's own cost (ms per mask, xgrammar's fill plus unpacking), cold compile time of each schema,
and the compile cache's hit rate over a workload that reuses a few distinct schemas. Greedy decoding.
Then the same comparison under beam search and speculative drafts (guided_decoders.py).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.engine.guided_decoders import fork_vs_replay, run_decoder_cases

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat-object": {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["id", "ok"]},
    "nested-enum-range": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]},
        },
        "required": ["name", "age", "role", "address"],
    },
    "long-array": {"type": "array", "items": {"type": "object", "properties": {"v": {"type": "number"}}, "required": ["v"]}, "minItems": 200},
}
TIMED_SCHEMA = "long-array"  # never completes within max_tokens: every request generates exactly max_tokens
Say = Callable[[str], None]


def run_guided_bench(engine_dir: Path, tokenizer_dir: Path, *, quick: bool = False, rounds: int = 2, progress: Say = lambda _: None) -> dict[str, Any]:
    import torch

    from pipeline.render.tokenizer_facts import tokenizer_facts
    from pipeline.render.xgrammar_tokenizer_info import write_tokenizer_info
    from refengine import LLMEngine, SamplingParams
    from refengine.guided.compiler import GuidedDecoder
    from refengine.guided.params import GuidedDecodingParams, GuideType

    torch.set_num_threads(1)
    engine = LLMEngine.from_engine_dir(engine_dir)
    with tempfile.TemporaryDirectory() as scratch:
        info_path = write_tokenizer_info(tokenizer_dir, tokenizer_facts(tokenizer_dir).eos_id, Path(scratch) / "info.json")
        engine.enable_guided_decoding(info_path)
    decoder: GuidedDecoder = engine.guided_decoder
    max_tokens = 16 if quick else 48
    batch = min(32, engine.config.max_batch_size)
    generator = random.Random(0)
    prompts = [[generator.randrange(3, engine.vocab_size) for _ in range(16)] for _ in range(batch)]
    guide = GuidedDecodingParams(GuideType.JSON_SCHEMA, json.dumps(SCHEMAS[TIMED_SCHEMA]))
    plain = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    guided = SamplingParams(max_tokens=max_tokens, temperature=0.0, guided_decoding=guide)
    warm_up = engine.generate(prompts[:2], [plain, guided])  # (and the schema's compile)

    def timed(batch_prompts: list[list[int]], params: Any, together: bool) -> tuple[float, float, int]:
        started, started_cpu = time.perf_counter(), time.process_time()
        groups = [batch_prompts] if together else [[prompt] for prompt in batch_prompts]
        outputs = [output for group in groups for output in engine.generate(group, params)]
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        return time.perf_counter() - started, time.process_time() - started_cpu, tokens

    cases = {"batch_1": (prompts[: 2 if quick else 4], False), f"batch_{batch}": (prompts, True)}
    best: dict[str, dict[str, float]] = {}
    for round_index in range(1 if quick else rounds):
        for case, (case_prompts, together) in cases.items():
            for name, params in (("unguided", plain), ("guided", guided)):
                before = decoder.stats()
                seconds, cpu_seconds, tokens = timed(case_prompts, params, together)
                after = decoder.stats()
                wall, cpu = 1000 * seconds / tokens, 1000 * cpu_seconds / tokens
                progress(f"round {round_index + 1} {case} {name}: {wall:.2f} ms/token wall, {cpu:.2f} CPU ({tokens} tokens)")
                entry = best.setdefault(case, {})
                entry[f"{name}_wall"] = min(wall, entry.get(f"{name}_wall", float("inf")))
                if cpu < entry.get(f"{name}_cpu", float("inf")):
                    entry[f"{name}_cpu"] = cpu
                    if name == "guided":
                        entry["mask_ms"] = 1000 * (after.mask_seconds - before.mask_seconds) / max(1, after.num_masks - before.num_masks)
    per_token = {
        case: {
            **{k: round(v, 3) for k, v in figures.items()},
            "ratio_wall": round(figures["guided_wall"] / figures["unguided_wall"], 3),
            "ratio_cpu": round(figures["guided_cpu"] / figures["unguided_cpu"], 3),
        }
        for case, figures in best.items()
    }
    decoders = run_decoder_cases(engine_dir, decoder._tokenizer_info, prompts, guide, max_tokens=max_tokens, rounds=1 if quick else rounds, progress=progress)
    return {
        "max_tokens": max_tokens,
        "schema": TIMED_SCHEMA,
        "per_token_ms": per_token,
        "beams_and_drafts_ms": decoders,
        "beam_state_copy": fork_vs_replay(decoder, guide, list(warm_up[1].outputs[0].token_ids)),
        "compile_ms": _compile_times(decoder, GuidedDecodingParams),
        "cache": _cache_hit_rate(engine, SamplingParams, GuidedDecodingParams, prompts[0]),
    }


def _compile_times(decoder: Any, params_class: Any) -> dict[str, float]:
    """Cold compile of each schema (a fresh cache), ms."""
    from refengine.guided.compiler import GuidedDecoder

    fresh = GuidedDecoder(decoder._tokenizer_info)
    times = {}
    for name, schema in SCHEMAS.items():
        started = time.perf_counter()
        fresh.compile(params_class("json_schema", json.dumps(schema)))
        times[name] = round(1000 * (time.perf_counter() - started), 2)
    return times


def _cache_hit_rate(engine: Any, sampling_class: Any, params_class: Any, prompt: list[int]) -> dict[str, Any]:
    """48 short requests cycling through 4 distinct guides (a fresh decoder: 4 compiles, 44 hits)."""
    guides = [params_class("regex", f"[a-z]{{{n}}}") for n in range(1, 5)]
    engine.enable_guided_decoding(engine.guided_decoder._tokenizer_info)
    for index in range(48):
        engine.generate([prompt], sampling_class(max_tokens=4, temperature=0.0, guided_decoding=guides[index % 4]))
    stats = engine.guided_decoder.stats()
    return {"requests": 48, "distinct_guides": 4, "compiles": stats.num_compiles, "hits": stats.num_cache_hits, "hit_rate": round(stats.cache_hit_rate, 3)}

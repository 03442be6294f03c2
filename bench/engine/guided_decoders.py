"""`bench engine --guided`, second table: guided vs unguided under beam search and speculative drafts.

The prompts, schema and `max_tokens` of guided.py's per-token figures (the schema never completes,
so every arm generates exactly `max_tokens` per request), in the same process and sitting, greedy,
interleaved over rounds (best round per figure; the machine is shared):

- beams: beam_width 4 (the engine's max_beam_width, at most 4), requests one after another; a
  token is one generated position (all beams computed for it);
- n-gram drafts (prompt lookup, K = 4, n-gram 3) at batch 1 and batch B;
- a draft model: the target drafting for itself, batch 1 (every draft is accepted in both arms: the
  guided draft is drafted under the grammar too), so the × is the grammar's own cost per token when
  a step yields K + 1 tokens.

Per case: ms per token (wall and process CPU) of each arm, guided/unguided ×, and for drafts the
acceptance (accepted / verified draft tokens) of each arm. Also what a beam reassignment costs per
beam: forking a grammar state against rebuilding it by replaying the beam's tokens (`fork_vs_replay`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_DRAFT_LEN = 4
NGRAM_SIZE = 3
MAX_BEAMS = 4
Say = Callable[[str], None]


def run_decoder_cases(
    engine_dir: Path, tokenizer_info: Any, prompts: list[list[int]], guide: Any, *, max_tokens: int, rounds: int, progress: Say
) -> dict[str, dict[str, float]]:
    from refengine import SamplingParams

    engines = _engines(engine_dir, tokenizer_info)
    beams = min(MAX_BEAMS, engines["beams"].config.max_beam_width)
    few = prompts[: min(4, len(prompts))]
    cases = {  # name: (engine, prompts, all at once, extra sampling fields)
        f"beams_{beams}_batch_1": ("beams", few[:2], False, {"beam_width": beams}),
        "ngram_batch_1": ("ngram", few, False, {}),
        f"ngram_batch_{len(prompts)}": ("ngram", prompts, True, {}),
        "draft_model_batch_1": ("draft_model", few[:2], False, {}),
    }
    best: dict[str, dict[str, float]] = {}
    for round_index in range(rounds):
        for case, (kind, case_prompts, together, extra) in cases.items():
            engine = engines[kind]
            for arm, guided in (("unguided", None), ("guided", guide)):
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0, guided_decoding=guided, **extra)
                before = engine.stats()
                wall, cpu, tokens = _timed(engine, case_prompts, params, together)
                after = engine.stats()
                progress(f"round {round_index + 1} {case} {arm}: {wall:.2f} ms/token wall, {cpu:.2f} CPU ({tokens} tokens)")
                entry = best.setdefault(case, {})
                entry[f"{arm}_wall"] = min(wall, entry.get(f"{arm}_wall", float("inf")))
                entry[f"{arm}_cpu"] = min(cpu, entry.get(f"{arm}_cpu", float("inf")))
                if kind != "beams":
                    drafted = after.num_draft_tokens - before.num_draft_tokens
                    accepted = after.num_accepted_draft_tokens - before.num_accepted_draft_tokens
                    entry[f"{arm}_acceptance"] = round(accepted / drafted, 3) if drafted else 0.0
    return {
        case: {
            **{k: round(v, 3) for k, v in figures.items()},
            "ratio_wall": round(figures["guided_wall"] / figures["unguided_wall"], 3),
            "ratio_cpu": round(figures["guided_cpu"] / figures["unguided_cpu"], 3),
        }
        for case, figures in best.items()
    }


def _engines(engine_dir: Path, tokenizer_info: Any) -> dict[str, Any]:
    """The built engine (beams) and two speculative engines over the same weights, guided decoding on."""
    from refengine import LLMEngine
    from refengine.checkpoint import load_engine_dir
    from refengine.model_runner import load_model, torch_dtype
    from refengine.speculative.draft_model import DraftModelDrafter
    from refengine.speculative.ngram import NGramDrafter

    beams = LLMEngine.from_engine_dir(engine_dir)
    config = beams.config
    speculative = config.replace(max_draft_len=MAX_DRAFT_LEN, max_beam_width=1)
    model = load_model(load_engine_dir(engine_dir).checkpoint, torch_dtype(config.compute_dtype))
    blocks = config.max_batch_size * -(-(config.max_seq_len + MAX_DRAFT_LEN) // config.tokens_per_block)
    engines = {
        "beams": beams,
        "ngram": LLMEngine(model, speculative, NGramDrafter(NGRAM_SIZE)),
        "draft_model": LLMEngine(model, speculative, DraftModelDrafter(model, blocks, config.tokens_per_block)),
    }
    for engine in engines.values():
        engine.enable_guided_decoding(tokenizer_info)
    return engines


def _timed(engine: Any, prompts: list[list[int]], params: Any, together: bool) -> tuple[float, float, int]:
    """(ms per token wall, ms per token CPU, tokens): a token is one position of the best output."""
    started, started_cpu = time.perf_counter(), time.process_time()
    groups = [prompts] if together else [[prompt] for prompt in prompts]
    outputs = [output for group in groups for output in engine.generate(group, params)]
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return 1000 * (time.perf_counter() - started) / tokens, 1000 * (time.process_time() - started_cpu) / tokens, tokens


def fork_vs_replay(decoder: Any, guide: Any, token_ids: list[int], repeats: int = 200) -> dict[str, float]:
    """µs to copy a grammar state `len(token_ids)` tokens in: `fork()` vs a new matcher fed the tokens."""
    state = decoder.new_state(guide)
    for token_id in token_ids:
        if not state.accept(token_id):
            raise ValueError(f"token {token_id} does not follow the guide: not a guided output")
    started = time.perf_counter()
    for _ in range(repeats):
        state.fork()
    forked = time.perf_counter()
    for _ in range(repeats):
        replayed = decoder.new_state(guide)
        for token_id in token_ids:
            replayed.accept(token_id)
    done = time.perf_counter()
    return {
        "tokens": len(token_ids),
        "fork_us": round(1e6 * (forked - started) / repeats, 1),
        "replay_us": round(1e6 * (done - forked) / repeats, 1),
    }

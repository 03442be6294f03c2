"""Speculative decoding on refengine: tokens/s with and without it, in one run, same prompts.

For each batch size B (1, 4, 32) the same greedy workload (held-out code prompts, B x
`rounds` requests with max_batch_size B, so B run concurrently) is run on the plain target and
on each speculative variant, one after the other (`repeats` times, interleaved: the best round of
each is reported, and each variant's CPU speed-up is also taken round by round against the plain
run of the same round, whose median is the steadier figure: adjacent runs share the machine's
load); outputs must equal the plain target's token
for token (greedy speculation changes speed, not text), and the report says whether they did.
Each engine first decodes one untimed request (warm-up); its counters are left out of the figures.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH_SIZES = (1, 4, 32)
WARMUP_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeBenchOptions:
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    rounds: int = 4  # requests per batch slot: B * rounds requests at batch B (at least min_requests)
    min_requests: int = 8
    prompt_tokens: int = 64
    max_tokens: int = 64
    max_draft_len: int = 4
    quick: bool = False
    num_threads: int = 1  # torch threads for every system (small matmuls on shared cores: one is fastest)
    repeats: int = 1  # interleaved rounds over the systems; each system's best round is reported
    fp16_weight_gemm: bool = True  # EngineConfig.fp16_weight_gemm of every system that does not set its own

    def requests_at(self, batch_size: int) -> int:
        if self.quick:
            return max(2, batch_size)
        return max(self.min_requests, batch_size * self.rounds) if batch_size < 32 else batch_size


@dataclass(frozen=True)
class System:
    """A variant's engine directory and how it is run."""

    engine_dir: Path
    num_draft_tokens: int | None = None  # sent by every request: a fixed draft length instead of the engine's adaptive one
    fp16_weight_gemm: bool | None = None  # EngineConfig.fp16_weight_gemm; None: the bench's option


Variant = Path | System


class _LoadedSystem:
    """One variant's engine at one batch size, loaded once and warmed up, timed once per round."""

    def __init__(self, system: System, batch_size: int, max_tokens: int, warmup_prompt: Sequence[int]) -> None:
        from refengine import LLMEngine, SamplingParams

        self.engine = LLMEngine.from_engine_dir(
            system.engine_dir, max_batch_size=batch_size, enable_prefix_caching=False, fp16_weight_gemm=system.fp16_weight_gemm
        )
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=system.num_draft_tokens)
        # One untimed request first: the first forwards of a process or an engine pay one-time costs (allocator, BLAS
        # set-up, first touch of the KV tensors); without it the system measured first (plain) was ~25 % slower.
        self.engine.generate([warmup_prompt], dataclasses.replace(self.params, max_tokens=min(max_tokens, WARMUP_TOKENS)))

    def run(self, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
        before = self.engine.stats()
        started, started_cpu = time.perf_counter(), time.process_time()
        outputs = self.engine.generate(prompts, self.params)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
        stats = _difference(self.engine.stats(), before)
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        return {
            "seconds": round(seconds, 3),
            "generated_tokens": generated,
            "tokens_per_second": round(generated / seconds, 2),
            # the work done: on a shared machine wall time swings with other jobs, this process's CPU time much less
            "cpu_seconds": round(cpu_seconds, 3),
            "tokens_per_cpu_second": round(generated / cpu_seconds, 2),
            "engine_steps": stats.num_steps,
            "draft_tokens": stats.num_draft_tokens,
            "accepted_draft_tokens": stats.num_accepted_draft_tokens,
            "acceptance_rate": round(stats.num_accepted_draft_tokens / stats.num_draft_tokens, 4) if stats.num_draft_tokens else None,
            **_tree_figures(stats),
            "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        }


def _best_of(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The round with the most tokens per CPU-second, its wall figures replaced by the best round's wall figures
    (the load of other jobs only ever slows a round down); greedy outputs are the same in every round."""
    best = dict(max(runs, key=lambda run: run["tokens_per_cpu_second"]))
    fastest = max(runs, key=lambda run: run["tokens_per_second"])
    best.update(seconds=fastest["seconds"], tokens_per_second=fastest["tokens_per_second"], rounds=len(runs))
    best["outputs_stable"] = all(run["outputs"] == runs[0]["outputs"] for run in runs)
    return best


def _paired_cpu_speedups(runs: Sequence[dict[str, Any]], plain_runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each round's CPU speed-up against the plain run of the same round, and their median."""
    paired = [run["tokens_per_cpu_second"] / base["tokens_per_cpu_second"] for run, base in zip(runs, plain_runs, strict=True)]
    return {"cpu_speedup_per_round": [round(ratio, 3) for ratio in paired], "cpu_speedup_median": round(statistics.median(paired), 3)}


def _difference(after: Any, before: Any) -> Any:
    """Engine counters of the timed run only (the warm-up request excluded); Medusa's per-node counts per node."""
    changes = {}
    for field in dataclasses.fields(after):
        new, old = getattr(after, field.name), getattr(before, field.name)
        if isinstance(new, tuple):  # (key, count) pairs
            earlier = dict(old)
            new = tuple((key, count - earlier.get(key, 0)) for key, count in new if count > earlier.get(key, 0))
        else:
            new = new - old
        changes[field.name] = new
    return dataclasses.replace(after, **changes)


def _tree_figures(stats: Any) -> dict[str, Any]:
    """Medusa: mean accepted tokens per tree step, and how often each tree node (by its path) was accepted."""
    if not stats.num_tree_steps:
        return {}
    return {
        "accepted_per_tree_step": round(stats.num_accepted_draft_tokens / stats.num_tree_steps, 3),
        "tree_node_acceptances": {str(list(path)): count for path, count in stats.tree_node_acceptances},
    }


def run_speculative_bench(
    variants: dict[str, Variant],
    prompts: Sequence[Sequence[int]],
    options: SpeculativeBenchOptions,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """`variants`: "plain" plus speculative engine directories ("draft_model", "ngram", ...), each optionally a `System`
    (a fixed per-request num_draft_tokens, its own fp16_weight_gemm)."""
    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(options.num_threads)
    try:
        rows = [_row(variants, prompts, options, batch_size, progress) for batch_size in options.batch_sizes]
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "variants": list(variants),
        "max_draft_len": options.max_draft_len,
        "prompt_tokens": options.prompt_tokens,
        "max_tokens": options.max_tokens,
        "torch_threads": options.num_threads,
        "repeats": options.repeats,
        "fp16_weight_gemm": options.fp16_weight_gemm,
        "rows": rows,
    }


def _row(variants, prompts, options: SpeculativeBenchOptions, batch_size: int, progress) -> dict[str, Any]:
    workload = [prompts[i % len(prompts)] for i in range(options.requests_at(batch_size))]
    row: dict[str, Any] = {"batch_size": batch_size, "requests": len(workload)}
    systems: dict[str, _LoadedSystem] = {}
    for name, variant in variants.items():
        system = variant if isinstance(variant, System) else System(variant)
        if system.fp16_weight_gemm is None:
            system = dataclasses.replace(system, fp16_weight_gemm=options.fp16_weight_gemm)
        systems[name] = _LoadedSystem(system, batch_size, options.max_tokens, workload[0])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for round_index in range(options.repeats):  # interleaved: every system sees the same spells of machine load
        for name, loaded in systems.items():
            progress(f"batch {batch_size}: {name} ({len(workload)} requests, round {round_index + 1}/{options.repeats})")
            runs[name].append(loaded.run(workload))
    del systems  # the engines' KV caches, before the next batch size allocates its own
    for name in variants:
        row[name] = _best_of(runs[name])
    plain = row["plain"]
    for name in variants:
        if name == "plain":
            continue
        result = row[name]
        result["speedup"] = round(result["tokens_per_second"] / plain["tokens_per_second"], 3)
        result["cpu_speedup"] = round(result["tokens_per_cpu_second"] / plain["tokens_per_cpu_second"], 3)
        # every round of both equal (greedy: the rounds cannot differ unless something is wrong)
        result["same_output_as_plain"] = result["outputs"] == plain["outputs"] and result["outputs_stable"] and plain["outputs_stable"]
        result["tokens_per_target_step"] = round(result["generated_tokens"] / result["engine_steps"], 3)
        result.update(_paired_cpu_speedups(runs[name], runs["plain"]))
    for name in variants:
        row[name].pop("outputs")
    return row


def render_markdown(result: dict[str, Any]) -> str:
    names = [name for name in result["variants"] if name != "plain"]
    header = (
        "| batch | requests | plain tok/s | "
        + " | ".join(
            f"{n} tok/s | {n} speed-up (wall) | {n} speed-up (CPU) | {n} CPU speed-up, median of rounds | {n} acceptance | {n} tokens/step | {n} = plain"
            for n in names
        )
        + " |"
    )
    lines = [header, "|" + "---|" * (3 + 7 * len(names))]
    for row in result["rows"]:
        cells = [str(row["batch_size"]), str(row["requests"]), f"{row['plain']['tokens_per_second']:.1f}"]
        for name in names:
            r = row[name]
            rate = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
            rounds = r["cpu_speedup_per_round"]
            median = f"{r['cpu_speedup_median']:.2f}x" + (f" ({min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else "")
            cells += [
                f"{r['tokens_per_second']:.1f}",
                f"{r['speedup']:.2f}x",
                f"{r['cpu_speedup']:.2f}x",
                median,
                rate,
                f"{r['tokens_per_target_step']:.2f}",
                "yes" if r["same_output_as_plain"] else "NO",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

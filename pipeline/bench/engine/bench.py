"""The engine benchmark: refengine's inflight batching against static batching and transformers.

`run_engine_bench` runs, in one process and one sitting, on the same model and the same seeded,
long-tailed workload (see `workload.py`):

  (a) refengine, inflight batching (the engine's own max_batch_size / max_num_tokens);
  (b) refengine, static batching (`batching="static"`, TensorRT-LLM's V1 batching): batches of
      B admitted together and held until their longest request ends, finished rows computing a
      discarded padding token every step, as `generate` does;
  (c) transformers `generate`, left-padded static batches of B (fp32, EOS off);
  (d) transformers continuous batching (manager API, explicit paged-cache sizes, no warmup pass);

plus the paged KV cache's utilisation during (a) and prefix reuse of a shared system prompt with
`enable_prefix_caching` on and off. Every system gets a short warm-up before its clock starts.

Machines are shared and noisy, so (a), (b) and (d) run `rounds` times, interleaved; each system's
figures are its best round (least disturbed), and every round's times are kept. Times are wall
clock and process CPU time (with one torch thread, CPU time is the work done, which other
processes on the machine disturb far less). The result is a JSON-ready dict.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any, Callable

from pipeline.bench.engine.systems import (
    HFContinuousSettings,
    SystemRun,
    run_hf_continuous,
    run_hf_static,
    run_prefix_reuse,
    run_refengine,
)
from pipeline.bench.engine.workload import make_prefix_workload, make_workload

TARGETS = {"inflight_vs_static": 3.0, "inflight_vs_hf_continuous": 1.5, "kv_paged_utilisation": 0.90,
           "shared_prefill_skipped": 0.90}
QUICK = {"num_requests": 16, "prompt_len": (16, 64), "output_mean": 12, "output_cap": 48, "max_batch_size": 4,
         "prefix_requests": 8, "prefix_wave_size": 4}
PREFIX_REQUESTS, PREFIX_WAVE_SIZE, PREFIX_OUTPUT_LEN = 32, 8, 16
SYSTEMS = ("refengine_inflight", "refengine_static", "hf_static_generate", "hf_continuous_batching")


def run_engine_bench(
    engine_dir: Path,
    hf_model_dir: Path,
    *,
    num_requests: int = 128,
    prompt_len: tuple[int, int] = (16, 256),
    output_mean: float = 64,
    output_cap: int = 512,
    seed: int = 0,
    static_batch_size: int | None = None,
    shared_prefix_len: int = 200,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    num_threads: int = 1,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark; returns figures, ratios and target checks (JSON-serialisable).

    `static_batch_size` (B of (b) and (c)) defaults to the engine's max_batch_size, which is also
    the request limit of (a) and (d). `quick` shrinks the workload (16 short requests,
    max_batch_size 4, one round) for tests. `num_threads` goes to `torch.set_num_threads` for all
    four systems. `rounds` (default 2, quick 1) repeats (a), (b), (d) interleaved; (c), the
    slowest, runs once. `progress(line)` receives status lines."""
    import torch

    say = progress or (lambda message: None)
    engine_dir, hf_model_dir = Path(engine_dir), Path(hf_model_dir)
    overrides: dict[str, Any] = {}
    prefix_requests, prefix_wave_size = PREFIX_REQUESTS, PREFIX_WAVE_SIZE
    if quick:
        num_requests = min(num_requests, QUICK["num_requests"])
        prompt_len, output_mean, output_cap = QUICK["prompt_len"], QUICK["output_mean"], QUICK["output_cap"]
        overrides["max_batch_size"] = QUICK["max_batch_size"]
        prefix_requests, prefix_wave_size = QUICK["prefix_requests"], QUICK["prefix_wave_size"]
    rounds = rounds if rounds is not None else (1 if quick else 2)
    recipe = dict(num_requests=num_requests, prompt_len=tuple(prompt_len), output_mean=output_mean,
                  output_cap=output_cap, seed=seed, static_batch_size=static_batch_size,
                  shared_prefix_len=shared_prefix_len, quick=quick, num_threads=num_threads, rounds=rounds)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        from refengine import LLMEngine

        engine = LLMEngine.from_engine_dir(engine_dir, **overrides)
        config, vocab_size = engine.config, engine.vocab_size
        batch_size = static_batch_size or config.max_batch_size
        static_overrides = {**overrides, "batching": "static"}
        if batch_size != config.max_batch_size:
            static_overrides["max_batch_size"] = batch_size
        static_engine = LLMEngine.from_engine_dir(engine_dir, **static_overrides)
        workload = make_workload(num_requests, vocab_size=vocab_size, prompt_len=prompt_len,
                                 output_mean=output_mean, output_cap=output_cap, seed=seed)
        warmup = make_workload(min(4, batch_size), vocab_size=vocab_size, prompt_len=(16, 64),
                               output_mean=8, output_cap=16, seed=seed + 1)
        model, pad_token_id = _load_hf_model(hf_model_dir)
        cb_settings = HFContinuousSettings(block_size=config.tokens_per_block, num_blocks=config.total_kv_blocks,
                                           max_batch_tokens=config.max_num_tokens,
                                           max_requests_per_batch=config.max_batch_size)
        say(f"workload: {workload.num_requests} requests, {sum(map(len, workload.prompts))} prompt tokens, "
            f"{workload.num_output_tokens} output tokens; B={batch_size}, torch threads={num_threads}, "
            f"rounds={rounds}")

        runs: dict[str, list[SystemRun]] = {name: [] for name in SYSTEMS}
        run_refengine(engine, warmup)
        run_refengine(static_engine, warmup)
        for index in range(rounds):
            tag = f"round {index + 1}/{rounds}"
            say(f"{tag} (a) refengine inflight batching ...")
            runs["refengine_inflight"].append(run_refengine(engine, workload, probe_kv=index == 0))
            say(_line("(a)", runs["refengine_inflight"][-1]))
            say(f"{tag} (b) refengine static batching, held batches of {batch_size} ...")
            runs["refengine_static"].append(run_refengine(static_engine, workload))
            say(_line("(b)", runs["refengine_static"][-1]))
            say(f"{tag} (d) transformers continuous batching ...")
            runs["hf_continuous_batching"].append(
                run_hf_continuous(model, workload, settings=cb_settings, pad_token_id=pad_token_id, warmup=warmup))
            say(_line("(d)", runs["hf_continuous_batching"][-1]))
        del engine, static_engine
        run_hf_static(model, warmup, batch_size=batch_size, pad_token_id=pad_token_id)
        say(f"(c) transformers generate, left-padded batches of {batch_size} ...")
        runs["hf_static_generate"].append(run_hf_static(model, workload, batch_size=batch_size,
                                                        pad_token_id=pad_token_id))
        say(_line("(c)", runs["hf_static_generate"][-1]))
        del model

        prefix_workload = make_prefix_workload(
            prefix_requests, vocab_size=vocab_size, shared_prefix_len=shared_prefix_len,
            output_len=PREFIX_OUTPUT_LEN, wave_size=prefix_wave_size, seed=seed)
        prefix = {}
        for enable in (False, True):
            say(f"prefix reuse {'on' if enable else 'off'}: {prefix_requests} requests, shared prefix "
                f"{shared_prefix_len} tokens, waves of {[len(w) for w in prefix_workload.waves]} ...")
            prefix["on" if enable else "off"] = run_prefix_reuse(
                engine_dir, overrides, prefix_workload, enable=enable, warmup_prompt=warmup.prompts[0]).figures
    finally:
        torch.set_num_threads(previous_threads)

    systems = {name: _best_of(system_runs) for name, system_runs in runs.items()}
    reference = runs["refengine_inflight"][0].outputs
    result = {
        "benchmark": "engine",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": _machine(num_threads),
        "recipe": {
            "call": "run_engine_bench(engine_dir, hf_model_dir, "
                    + ", ".join(f"{k}={v!r}" for k, v in recipe.items()) + ")",
            "engine_dir": str(engine_dir),
            "hf_model_dir": str(hf_model_dir),
            "engine_overrides": overrides,
            "static_engine_overrides": static_overrides,
            "timing": "best of the rounds (wall and CPU time separately); warm-up run before each clock",
        },
        "engine_config": {
            "max_batch_size": config.max_batch_size, "max_num_tokens": config.max_num_tokens,
            "max_seq_len": config.max_seq_len, "tokens_per_block": config.tokens_per_block,
            "num_kv_blocks": config.total_kv_blocks, "scheduler_policy": config.scheduler_policy.value,
            "enable_chunked_context": config.enable_chunked_context,
            "enable_prefix_caching": config.enable_prefix_caching, "compute_dtype": config.compute_dtype,
        },
        "batch_size": batch_size,
        "workload": workload.summary(),
        "systems": systems,
        "hf_continuous_batching": {"api": "init_continuous_batching + add_request(ids, max_new_tokens=N, "
                                          "eos_token_id=-1), per-request lengths",
                                   "config": cb_settings.as_dict()},
        "kv_utilisation": runs["refengine_inflight"][0].extra["kv_utilisation"],
        "prefix_reuse": _prefix_summary(prefix, prefix_workload, config.tokens_per_block),
        "agreement_with_refengine_inflight": {
            name: _agreement(reference, system_runs[0].outputs)
            for name, system_runs in runs.items() if name != "refengine_inflight"
        },
    }
    result["ratios"] = _ratios(systems, runs)
    result["targets"] = _targets(result)
    return result


def _line(label: str, run: SystemRun) -> str:
    f = run.figures
    steps = f" in {f['engine_steps']} steps" if "engine_steps" in f else ""
    useful = f.get("useful_fraction_of_generated", 1)
    padding = f" ({100 * useful:.1f} % of generated tokens useful)" if useful < 1 else ""
    return (f"{label} {f['useful_output_tokens']} tokens in {f['wall_s']:.2f} s (cpu {f['cpu_s']:.2f} s){steps}: "
            f"{f['tokens_per_s']:.0f} tok/s{padding}")


def _load_hf_model(hf_model_dir: Path) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32).eval()
    pad = model.config.pad_token_id
    return model, 0 if pad is None else int(pad)


def _best_of(runs: list[SystemRun]) -> dict[str, Any]:
    """The least-disturbed round's figures (min wall; CPU figures from the min-CPU round)."""
    best = dict(min(runs, key=lambda r: r.figures["wall_s"]).figures)
    best_cpu = min(runs, key=lambda r: r.figures["cpu_s"]).figures
    best["cpu_s"], best["tokens_per_cpu_s"] = best_cpu["cpu_s"], best_cpu["tokens_per_cpu_s"]
    best["rounds_wall_s"] = [r.figures["wall_s"] for r in runs]
    best["rounds_cpu_s"] = [r.figures["cpu_s"] for r in runs]
    return best


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _ratios(systems: dict[str, dict[str, Any]], runs: dict[str, list[SystemRun]]) -> dict[str, Any]:
    a = systems["refengine_inflight"]
    out: dict[str, Any] = {}
    pairs = (("inflight_vs_static", "refengine_static"), ("inflight_vs_hf_static", "hf_static_generate"),
             ("inflight_vs_hf_continuous", "hf_continuous_batching"))
    for key, other in pairs:
        out[key] = _ratio(a["tokens_per_s"], systems[other]["tokens_per_s"])
        out[key + "_cpu_time"] = _ratio(a["tokens_per_cpu_s"], systems[other]["tokens_per_cpu_s"])
    out["per_round_wall"] = [
        {key: _ratio(runs[other][i].figures["wall_s"], runs["refengine_inflight"][i].figures["wall_s"])
         for key, other in pairs if len(runs[other]) > i}
        for i in range(len(runs["refengine_inflight"]))
    ]
    b = systems["refengine_static"]
    out["steps_static_over_inflight"] = _ratio(b["engine_steps"], a["engine_steps"])
    out["generated_rows_static_over_inflight"] = _ratio(b["generated_tokens_incl_padding_rows"],
                                                        a["generated_tokens_incl_padding_rows"])
    return out


def _targets(result: dict[str, Any]) -> dict[str, Any]:
    ratios = result["ratios"]
    values = {
        "inflight_vs_static": (ratios["inflight_vs_static"], ratios["inflight_vs_static_cpu_time"]),
        "inflight_vs_hf_continuous": (ratios["inflight_vs_hf_continuous"],
                                      ratios["inflight_vs_hf_continuous_cpu_time"]),
        "kv_paged_utilisation": (result["kv_utilisation"].get("paged_mean", 0.0), None),
        "shared_prefill_skipped": (result["prefix_reuse"]["on"]["shared_prefill_skipped_fraction"], None),
    }
    targets = {}
    for name, (value, cpu_value) in values.items():
        entry = {"value": value, "target": f">= {TARGETS[name]}", "met": value is not None and value >= TARGETS[name]}
        if cpu_value is not None:
            entry["value_cpu_time"] = cpu_value
            entry["met_cpu_time"] = cpu_value >= TARGETS[name]
        targets[name] = entry
    return targets


def _prefix_summary(runs: dict[str, dict[str, Any]], workload: Any, tokens_per_block: int) -> dict[str, Any]:
    on, off = runs["on"], runs["off"]
    shared = len(workload.shared_prefix)
    reusable = (shared // tokens_per_block) * tokens_per_block
    return {
        "num_requests": workload.num_requests,
        "shared_prefix_len": shared,
        "output_len": workload.output_len,
        "waves": [len(w) for w in workload.waves],
        "submission": "a wave is submitted once the previous one finished; the first wave (1 request) "
                      "computes the shared prefix",
        "on": on,
        "off": off,
        "prefill_tokens_saved_fraction": round(1 - on["prefill_tokens_computed"] / off["prefill_tokens_computed"], 4),
        "ttft_off_over_on": _ratio(off["ttft_mean_s"], on["ttft_mean_s"]),
        "max_skippable_fraction": round(reusable * (workload.num_requests - 1) / (shared * workload.num_requests), 4),
    }


def _agreement(reference: dict[int, tuple[int, ...]], other: dict[int, tuple[int, ...]]) -> dict[str, Any]:
    """Identical request outputs, and the mean fraction of tokens before the first difference."""
    common = [i for i in reference if i in other]
    fractions = []
    for i in common:
        a, b = reference[i], other[i]
        same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fractions.append(same / max(len(a), 1))
    return {"requests": len(common), "identical_outputs": sum(1 for i in common if reference[i] == other[i]),
            "mean_matching_prefix_fraction": round(sum(fractions) / len(fractions), 4) if common else None}


def _machine(num_threads: int) -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": num_threads,
            "load_average_1min_at_end": load}

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
processes on the machine disturb far less). What runs is an `EngineBenchOptions`; the result
(figures.py) is a JSON-ready dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.engine.figures import engine_result
from bench.engine.systems import (
    HFContinuousSettings,
    SystemRun,
    run_hf_continuous,
    run_hf_static,
    run_prefix_reuse,
    run_refengine,
)
from bench.engine.workload import PrefixWorkload, Workload, make_prefix_workload, make_workload


@dataclasses.dataclass(frozen=True)
class QuickSizes:
    """The workload and engine sizes `quick` shrinks to."""

    num_requests: int = 16
    prompt_len: tuple[int, int] = (16, 64)
    output_mean: float = 12
    output_cap: int = 48
    max_batch_size: int = 4
    prefix_requests: int = 8
    prefix_wave_size: int = 4


QUICK = QuickSizes()
PREFIX_REQUESTS, PREFIX_WAVE_SIZE, PREFIX_OUTPUT_LEN = 32, 8, 16
SYSTEMS = ("refengine_inflight", "refengine_static", "hf_static_generate", "hf_continuous_batching")
Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class EngineBenchOptions:
    """What `run_engine_bench` runs. `num_requests` prompts of random tokens with lengths uniform in
    `prompt_len`, output lengths geometric with mean `output_mean` capped at `output_cap` (`seed`).
    `static_batch_size` (B of (b) and (c)) defaults to the engine's max_batch_size, which is also
    the request limit of (a) and (d). `shared_prefix_len`: the system prompt of the prefix-reuse
    run. `quick` shrinks the workload (16 short requests, max_batch_size 4, one round) for tests.
    `num_threads` goes to `torch.set_num_threads` for all four systems. `rounds` (default 2, quick
    1) repeats (a), (b), (d) interleaved; (c), the slowest, runs once."""

    num_requests: int = 128
    prompt_len: tuple[int, int] = (16, 256)
    output_mean: float = 64
    output_cap: int = 512
    seed: int = 0
    static_batch_size: int | None = None
    shared_prefix_len: int = 200
    quick: bool = False
    num_threads: int = 1
    rounds: int | None = None

    def resolved(self) -> EngineBenchOptions:
        """With `quick` applied and `rounds` decided: what runs, and what the recipe records."""
        options = self
        if self.quick:
            options = dataclasses.replace(
                self,
                num_requests=min(self.num_requests, QUICK.num_requests),
                prompt_len=QUICK.prompt_len,
                output_mean=QUICK.output_mean,
                output_cap=QUICK.output_cap,
            )
        low, high = options.prompt_len  # callers may pass a list
        return dataclasses.replace(options, prompt_len=(low, high), rounds=self.round_count)

    @property
    def round_count(self) -> int:
        """`rounds`, or its default: 2, one when quick."""
        return self.rounds if self.rounds is not None else (1 if self.quick else 2)

    @property
    def engine_overrides(self) -> dict[str, Any]:
        return {"max_batch_size": QUICK.max_batch_size} if self.quick else {}

    @property
    def prefix_requests(self) -> int:
        return QUICK.prefix_requests if self.quick else PREFIX_REQUESTS

    @property
    def prefix_wave_size(self) -> int:
        return QUICK.prefix_wave_size if self.quick else PREFIX_WAVE_SIZE

    def call(self) -> str:
        """The recipe's call: every setting, by name."""
        settings = ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self))
        return f"run_engine_bench(engine_dir, hf_model_dir, {settings})"


@dataclasses.dataclass(frozen=True)
class EngineSetup:
    """What every system of one run shares: the engine's limits, B, the workloads, the HF settings."""

    config: Any  # the refengine engine's config
    vocab_size: int
    batch_size: int  # B of (b) and (c)
    overrides: dict[str, Any]  # engine overrides of (a)
    static_overrides: dict[str, Any]  # of (b)
    workload: Workload
    warmup: Workload
    pad_token_id: int
    cb_settings: HFContinuousSettings


def run_engine_bench(
    engine_dir: Path, hf_model_dir: Path, options: EngineBenchOptions = EngineBenchOptions(), *, progress: Say | None = None
) -> dict[str, Any]:
    """Run the whole benchmark; returns figures, ratios and target checks (JSON-serialisable).
    `progress(line)` receives status lines."""
    import torch

    say = progress or (lambda message: None)
    engine_dir, hf_model_dir = Path(engine_dir), Path(hf_model_dir)
    options = options.resolved()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(options.num_threads)
    try:
        engine, static_engine, model, setup = _load(engine_dir, hf_model_dir, options)
        say(
            f"workload: {setup.workload.num_requests} requests, {sum(map(len, setup.workload.prompts))} prompt tokens, "
            f"{setup.workload.num_output_tokens} output tokens; B={setup.batch_size}, torch threads={options.num_threads}, "
            f"rounds={options.rounds}"
        )
        runs = _interleaved_rounds(engine, static_engine, model, setup, options.round_count, say)
        del engine, static_engine
        runs["hf_static_generate"].append(_hf_static(model, setup, say))
        del model
        prefix_workload = make_prefix_workload(
            options.prefix_requests,
            vocab_size=setup.vocab_size,
            shared_prefix_len=options.shared_prefix_len,
            output_len=PREFIX_OUTPUT_LEN,
            wave_size=options.prefix_wave_size,
            seed=options.seed,
        )
        prefix = _prefix_reuse(engine_dir, options, setup, prefix_workload, say)
    finally:
        torch.set_num_threads(previous_threads)
    dirs = {"engine_dir": engine_dir, "hf_model_dir": hf_model_dir}
    return engine_result(options.call(), dirs, setup, runs, prefix, prefix_workload, options.num_threads)


def _load(engine_dir: Path, hf_model_dir: Path, options: EngineBenchOptions) -> tuple[Any, Any, Any, EngineSetup]:
    """The inflight and static refengine engines, the transformers model, and what they share."""
    from refengine import LLMEngine

    overrides = options.engine_overrides
    engine = LLMEngine.from_engine_dir(engine_dir, **overrides)
    config, vocab_size = engine.config, engine.vocab_size
    batch_size = options.static_batch_size or config.max_batch_size
    static_overrides = {**overrides, "batching": "static"}
    if batch_size != config.max_batch_size:
        static_overrides["max_batch_size"] = batch_size
    static_engine = LLMEngine.from_engine_dir(engine_dir, **static_overrides)
    workload = make_workload(
        options.num_requests,
        vocab_size=vocab_size,
        prompt_len=options.prompt_len,
        output_mean=options.output_mean,
        output_cap=options.output_cap,
        seed=options.seed,
    )
    warmup = make_workload(min(4, batch_size), vocab_size=vocab_size, prompt_len=(16, 64), output_mean=8, output_cap=16, seed=options.seed + 1)
    model, pad_token_id = _load_hf_model(hf_model_dir)
    cb_settings = HFContinuousSettings(
        block_size=config.tokens_per_block,
        num_blocks=config.total_kv_blocks,
        max_batch_tokens=config.max_num_tokens,
        max_requests_per_batch=config.max_batch_size,
    )
    setup = EngineSetup(config, vocab_size, batch_size, overrides, static_overrides, workload, warmup, pad_token_id, cb_settings)
    return engine, static_engine, model, setup


def _interleaved_rounds(engine: Any, static_engine: Any, model: Any, setup: EngineSetup, rounds: int, say: Say) -> dict[str, list[SystemRun]]:
    """(a), (b) and (d), `rounds` times interleaved, after the refengine engines' warm-up."""
    runs: dict[str, list[SystemRun]] = {name: [] for name in SYSTEMS}
    workload, warmup = setup.workload, setup.warmup
    run_refengine(engine, warmup)
    run_refengine(static_engine, warmup)
    for index in range(rounds):
        tag = f"round {index + 1}/{rounds}"
        say(f"{tag} (a) refengine inflight batching ...")
        runs["refengine_inflight"].append(run_refengine(engine, workload, probe_kv=index == 0))
        say(_line("(a)", runs["refengine_inflight"][-1]))
        say(f"{tag} (b) refengine static batching, held batches of {setup.batch_size} ...")
        runs["refengine_static"].append(run_refengine(static_engine, workload))
        say(_line("(b)", runs["refengine_static"][-1]))
        say(f"{tag} (d) transformers continuous batching ...")
        runs["hf_continuous_batching"].append(run_hf_continuous(model, workload, settings=setup.cb_settings, pad_token_id=setup.pad_token_id, warmup=warmup))
        say(_line("(d)", runs["hf_continuous_batching"][-1]))
    return runs


def _hf_static(model: Any, setup: EngineSetup, say: Say) -> SystemRun:
    """(c), once (the slowest), after its warm-up."""
    run_hf_static(model, setup.warmup, batch_size=setup.batch_size, pad_token_id=setup.pad_token_id)
    say(f"(c) transformers generate, left-padded batches of {setup.batch_size} ...")
    run = run_hf_static(model, setup.workload, batch_size=setup.batch_size, pad_token_id=setup.pad_token_id)
    say(_line("(c)", run))
    return run


def _prefix_reuse(engine_dir: Path, options: EngineBenchOptions, setup: EngineSetup, workload: PrefixWorkload, say: Say) -> dict[str, dict[str, Any]]:
    """The prefix-reuse figures with `enable_prefix_caching` off, then on."""
    prefix = {}
    for enable in (False, True):
        say(
            f"prefix reuse {'on' if enable else 'off'}: {options.prefix_requests} requests, shared prefix "
            f"{options.shared_prefix_len} tokens, waves of {[len(w) for w in workload.waves]} ..."
        )
        prefix["on" if enable else "off"] = run_prefix_reuse(
            engine_dir, setup.overrides, workload, enable=enable, warmup_prompt=setup.warmup.prompts[0]
        ).figures
    return prefix


def _line(label: str, run: SystemRun) -> str:
    f = run.figures
    steps = f" in {f['engine_steps']} steps" if "engine_steps" in f else ""
    useful = f.get("useful_fraction_of_generated", 1)
    padding = f" ({100 * useful:.1f} % of generated tokens useful)" if useful < 1 else ""
    return f"{label} {f['useful_output_tokens']} tokens in {f['wall_s']:.2f} s (cpu {f['cpu_s']:.2f} s){steps}: {f['tokens_per_s']:.0f} tok/s{padding}"


def _load_hf_model(hf_model_dir: Path) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32).eval()
    pad = model.config.pad_token_id
    return model, 0 if pad is None else int(pad)

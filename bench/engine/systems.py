"""The systems the engine benchmark drives, each over the same `Workload`.

- `run_refengine`: refengine through its public API, everything submitted at once, `step()` until
  done. The engine's `batching` decides: "inflight" (the scheduler refills freed rows at once)
  or "static" (TensorRT-LLM's V1 batching: a batch of up to max_batch_size requests is held until
  its longest request ends; finished rows keep their slot and compute a discarded padding token
  every step, as `generate` does; only the tokens a request asked for count as useful).
- `run_hf_static`: transformers `generate` on left-padded batches (every row runs the batch's
  longest output; only the tokens a request asked for count as useful).
- `run_hf_continuous`: transformers continuous batching through the manager API
  (`init_continuous_batching` + `add_request(ids, max_new_tokens=N)`), since `generate_batch`
  takes one `max_new_tokens` for all requests.
- `run_prefix_reuse`: a shared system prompt submitted in waves, with refengine's prefix caching
  on or off.

Each returns a `SystemRun`: the figures (JSON-ready) plus each request's output tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.engine.workload import PrefixWorkload, Workload
from refengine import LLMEngine, SamplingParams


@dataclass
class SystemRun:
    figures: dict[str, Any]
    outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # request index -> output tokens
    extra: dict[str, Any] = field(default_factory=dict)


class _Clock:
    """Wall and process-CPU time since `start`, minus the time spent in measurement probes."""

    def __init__(self) -> None:
        self.wall0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.excluded_wall = 0.0
        self.excluded_cpu = 0.0

    def exclude(self, wall: float, cpu: float) -> None:
        self.excluded_wall += wall
        self.excluded_cpu += cpu

    def figures(self, useful_tokens: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall0 - self.excluded_wall
        cpu = time.process_time() - self.cpu0 - self.excluded_cpu
        return {
            "useful_output_tokens": useful_tokens,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "tokens_per_s": round(useful_tokens / wall, 1),
            "tokens_per_cpu_s": round(useful_tokens / cpu, 1) if cpu > 0 else None,
        }


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=None)


class KVProbe:
    """Samples, after every engine step, live KV tokens against (1) the paged cache's allocated
    capacity (blocks in use × tokens_per_block) and (2) a contiguous reservation of max_seq_len
    per running sequence."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self._tokens_per_block = engine.config.tokens_per_block
        self._max_seq_len = engine.config.max_seq_len
        self.samples: list[tuple[int, int, int]] = []  # (live tokens, paged capacity, contiguous capacity)

    def sample(self) -> None:
        running = self._engine.scheduler.num_running
        if running == 0:
            return
        usage = self._engine.kv_cache_usage()
        self.samples.append((usage.num_live_tokens, usage.num_used_blocks * self._tokens_per_block, running * self._max_seq_len))

    def figures(self) -> dict[str, Any]:
        samples = [s for s in self.samples if s[1] > 0]
        if not samples:
            return {"num_steps_sampled": 0}
        live = sum(s[0] for s in samples)
        return {
            "num_steps_sampled": len(samples),
            "paged_mean": round(sum(s[0] / s[1] for s in samples) / len(samples), 4),
            "contiguous_mean": round(sum(s[0] / s[2] for s in samples) / len(samples), 4),
            "paged_token_weighted": round(live / sum(s[1] for s in samples), 4),
            "contiguous_token_weighted": round(live / sum(s[2] for s in samples), 4),
            "mean_live_tokens": round(live / len(samples), 1),
            "mean_paged_capacity_tokens": round(sum(s[1] for s in samples) / len(samples), 1),
            "mean_contiguous_capacity_tokens": round(sum(s[2] for s in samples) / len(samples), 1),
            "tokens_per_block": self._tokens_per_block,
            "max_seq_len": self._max_seq_len,
        }


def _groups(num: int, batch_size: int | None) -> list[range]:
    if batch_size is None:
        return [range(num)]
    return [range(i, min(i + batch_size, num)) for i in range(0, num, batch_size)]


def run_refengine(engine: LLMEngine, workload: Workload, *, probe_kv: bool = False, lora: Sequence[Any] | None = None) -> SystemRun:
    """All requests added at once, `step()` until done, in the engine's batching mode; `lora`: each request's
    `LoraRequest` (or None)."""
    probe = KVProbe(engine) if probe_kv else None
    outputs: dict[int, tuple[int, ...]] = {}
    steps = 0
    scheduler = engine.scheduler
    preemptions0, padding0 = scheduler.num_preemptions, scheduler.num_padding_tokens
    clock = _Clock()
    index_of = {
        engine.add_request(workload.prompts[i], greedy(workload.output_lens[i]), lora=lora[i] if lora else None): i for i in range(workload.num_requests)
    }
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished and output.request_id in index_of:
                outputs[index_of[output.request_id]] = output.outputs[0].token_ids
        steps += 1
        if probe is not None:
            wall, cpu = time.perf_counter(), time.process_time()
            probe.sample()
            clock.exclude(time.perf_counter() - wall, time.process_time() - cpu)
    figures = clock.figures(sum(len(outputs[i]) for i in outputs))
    figures["batching"] = engine.config.batching.value
    figures["engine_steps"] = steps
    figures["preemptions"] = scheduler.num_preemptions - preemptions0
    padding = scheduler.num_padding_tokens - padding0
    figures["generated_tokens_incl_padding_rows"] = figures["useful_output_tokens"] + padding
    figures["useful_fraction_of_generated"] = round(figures["useful_output_tokens"] / figures["generated_tokens_incl_padding_rows"], 4)
    figures["all_requests_ran_their_length"] = _ran_their_length(outputs, workload.output_lens)
    run = SystemRun(figures, outputs)
    if probe is not None:
        run.extra["kv_utilisation"] = probe.figures()
    return run


def _ran_their_length(outputs: Mapping[int, Sequence[int]], lengths: Sequence[int]) -> bool:
    return len(outputs) == len(lengths) and all(len(outputs[i]) == n for i, n in enumerate(lengths))


def run_hf_static(model: Any, workload: Workload, *, batch_size: int, pad_token_id: int) -> SystemRun:
    import torch
    from transformers import GenerationConfig

    outputs: dict[int, tuple[int, ...]] = {}
    generated = 0
    clock = _Clock()
    with torch.inference_mode():
        for group in _groups(workload.num_requests, batch_size):
            prompts = [workload.prompts[i] for i in group]
            longest_prompt = max(len(p) for p in prompts)
            new_tokens = max(workload.output_lens[i] for i in group)
            input_ids = torch.full((len(prompts), longest_prompt), pad_token_id, dtype=torch.int64)
            attention_mask = torch.zeros_like(input_ids)
            for row, prompt in enumerate(prompts):  # left padding
                input_ids[row, longest_prompt - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
                attention_mask[row, longest_prompt - len(prompt) :] = 1
            config = GenerationConfig(
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                eos_token_id=None,
                pad_token_id=pad_token_id,
            )
            result = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
            tokens = result[:, longest_prompt:].tolist()
            generated += len(prompts) * new_tokens
            for row, i in enumerate(group):
                outputs[i] = tuple(tokens[row][: workload.output_lens[i]])
    figures = clock.figures(sum(len(o) for o in outputs.values()))
    figures["generated_tokens_incl_padding_rows"] = generated
    figures["useful_fraction_of_generated"] = round(figures["useful_output_tokens"] / generated, 4)
    figures["all_requests_ran_their_length"] = _ran_their_length(outputs, workload.output_lens)
    return SystemRun(figures, outputs)


@dataclass(frozen=True)
class HFContinuousSettings:
    block_size: int
    num_blocks: int
    max_batch_tokens: int
    max_requests_per_batch: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, allow_block_sharing=False, use_cuda_graph=False, use_async_batching=False)


def run_hf_continuous(
    model: Any,
    workload: Workload,
    *,
    settings: HFContinuousSettings,
    pad_token_id: int,
    warmup: Workload | None = None,
    timeout_s: float = 600.0,
) -> SystemRun:
    """Continuous batching via the manager API, per-request `max_new_tokens`, EOS disabled (-1).

    The manager (and its paged cache) is created and started before the clock, and warmed with
    `warmup`'s requests, as refengine's engine is."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=pad_token_id, max_new_tokens=workload.output_cap)
    cb_config = ContinuousBatchingConfig(**settings.as_dict())
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)
    restore = _cpu_memory_breakdown_without_psutil()
    manager.start()
    try:
        if warmup is not None:
            _hf_submit_and_collect(manager, warmup, timeout_s)
        clock = _Clock()
        outputs = _hf_submit_and_collect(manager, workload, timeout_s)
        figures = clock.figures(sum(len(o) for o in outputs.values()))
    finally:
        manager.stop(block=True, timeout=60)
        manager.destroy()
        restore()
    figures["all_requests_ran_their_length"] = _ran_their_length(outputs, workload.output_lens)
    return SystemRun(figures, outputs)


def _cpu_memory_breakdown_without_psutil() -> Callable[[], None]:
    """transformers sizes/checks the paged cache against host memory via psutil; without psutil
    it sees 0 bytes available and fails ("Memory footprint … is more than available memory 0"),
    even with explicit sizes. Then read /proc instead, until the returned undo is called."""
    try:
        import psutil  # noqa: F401

        return lambda: None
    except ImportError:
        pass
    import torch
    from transformers.generation.continuous_batching import cache

    original = cache.get_device_and_memory_breakdown

    def from_proc() -> tuple[Any, int, int, int]:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return torch.device("cpu"), total, rss, rss

    cache.get_device_and_memory_breakdown = from_proc

    def restore() -> None:
        cache.get_device_and_memory_breakdown = original

    return restore


def _hf_submit_and_collect(manager: Any, workload: Workload, timeout_s: float) -> dict[int, tuple[int, ...]]:
    index_of = {
        manager.add_request(list(prompt), max_new_tokens=n, eos_token_id=-1): i for i, (prompt, n) in enumerate(zip(workload.prompts, workload.output_lens))
    }
    outputs: dict[int, tuple[int, ...]] = {}
    deadline = time.monotonic() + timeout_s
    while len(outputs) < len(index_of):
        result = manager.get_result(timeout=0.5)
        if result is not None and result.is_finished() and result.request_id in index_of:
            if result.error:
                raise RuntimeError(f"transformers continuous batching failed {result.request_id}: {result.error}")
            outputs[index_of[result.request_id]] = tuple(result.generated_tokens)
        elif result is None and (not manager.is_running() or time.monotonic() > deadline):
            raise RuntimeError(f"transformers continuous batching stopped with {len(outputs)}/{len(index_of)} requests done ({manager.fatal_error!r})")
    return outputs


def run_prefix_reuse(engine_dir: Path, overrides: dict[str, Any], workload: PrefixWorkload, *, enable: bool, warmup_prompt: Sequence[int]) -> SystemRun:
    """Submit the waves one after the other (the next once the previous finished); count the
    prompt tokens served from the cache and time each request's first token."""
    engine = LLMEngine.from_engine_dir(engine_dir, **{**overrides, "enable_prefix_caching": enable})
    engine.generate([list(warmup_prompt)], greedy(4))
    scheduler = engine.scheduler
    hits0, preemptions0 = scheduler.num_prefix_cache_hit_tokens, scheduler.num_preemptions
    ttft: dict[int, float] = {}
    wave_hits = []
    clock = _Clock()
    for wave in workload.waves:
        hits_before = scheduler.num_prefix_cache_hit_tokens
        submitted = {}
        for i in wave:
            submitted[engine.add_request(workload.prompts[i], greedy(workload.output_len))] = (i, time.perf_counter())
        while engine.has_unfinished():
            outputs = engine.step()
            now = time.perf_counter()
            for output in outputs:
                index, t_submit = submitted[output.request_id]
                if index not in ttft and output.outputs[0].token_ids:
                    ttft[index] = now - t_submit
        wave_hits.append(scheduler.num_prefix_cache_hit_tokens - hits_before)
    wall = time.perf_counter() - clock.wall0
    hits = scheduler.num_prefix_cache_hit_tokens - hits0
    prompt_tokens = sum(len(p) for p in workload.prompts)
    shared_tokens = len(workload.shared_prefix) * workload.num_requests
    later = [ttft[i] for wave in workload.waves[1:] for i in wave]
    figures = {
        "enable_prefix_caching": enable,
        "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": prompt_tokens - hits,
        "prefill_tokens_from_cache": hits,
        "shared_prefill_tokens": shared_tokens,
        "shared_prefill_skipped_fraction": round(hits / shared_tokens, 4),
        "cache_hit_tokens_per_wave": wave_hits,
        "ttft_mean_s": round(sum(ttft.values()) / len(ttft), 4),
        "ttft_mean_after_first_wave_s": round(sum(later) / len(later), 4) if later else None,
        "wall_s": round(wall, 3),
        "preemptions": scheduler.num_preemptions - preemptions0,
    }
    return SystemRun(figures)

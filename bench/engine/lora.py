"""What serving many LoRA adapters costs refengine (for `bench engine --lora`): tokens/s of one batch of requests spread
over several adapters against the same batch with no adapter, side by side in one process.

Both runs use the engine of `engine_dir` with max_batch_size raised to the request count (every request in one running
batch), the same seeded workload (random prompts, geometric output lengths without an end id: every request runs its
length), one torch thread, greedy decoding. The adapters are random, of `rank` on every projection of every layer, as
a PEFT adapter of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj converts (TensorRT-LLM's attn_q /
attn_k / attn_v / attn_dense / mlp_h_to_4h / mlp_gate / mlp_4h_to_h; attn_qkv instead of the three for a model with a
fused qkv_proj, as Phi-3's), in NVIDIA's lora_weights / lora_config layout (float16), loaded before the clock starts
(as `lora_prefetch_dir` does); request i runs adapter i mod `num_adapters`.

The two runs alternate for `rounds` rounds after a warm-up of each. Machines are shared and noisy: each round's LoRA run
is compared with the base run just before it (the pair shares the machine's state), and the goal is read on the median
of those paired ratios; each side's best round, and the ratio of the bests in wall and in CPU time, are reported too.
The goal: the LoRA batch keeps at least 0.8× the base batch's tokens/s (S-LoRA reports a small overhead for thousands
of adapters).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from bench.engine.systems import SystemRun, run_refengine
from bench.engine.workload import make_workload

GOAL = 0.8


@dataclasses.dataclass(frozen=True)
class LoraBenchOptions:
    num_requests: int = 32
    num_adapters: int = 8
    rank: int = 8
    prompt_len: tuple[int, int] = (16, 128)
    output_mean: float = 64
    output_cap: int = 128
    rounds: int = 5
    seed: int = 0
    num_threads: int = 1

    def call(self) -> str:
        settings = ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self))
        return f"run_lora_bench(engine_dir, {settings})"


def random_adapter(targets: dict[int, Any], num_layers: int, rank: int, seed: int, scale: float = 0.05) -> tuple[Any, Any]:
    """(lora_weights [1, rows, values] float16, lora_config [1, rows, 3] int32): a random adapter of `rank` on every module
    of `targets` (module id -> `refengine.lora.modules.ModuleTarget`) in every layer, values normal × `scale`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows, config = [], []
    for layer in range(num_layers):
        for module_id, target in sorted(targets.items()):
            rows.append(scale * torch.randn(rank * (target.in_features + target.out_features), generator=generator))
            config.append([module_id, layer, rank])
    width = max(len(row) for row in rows)
    weights = torch.stack([torch.nn.functional.pad(row, (0, width - len(row))) for row in rows]).half()
    return weights.unsqueeze(0).numpy(), torch.tensor([config], dtype=torch.int32).numpy()


def projections(targets: dict[int, Any]) -> dict[int, Any]:
    """The modules a PEFT adapter of every projection converts to: attn_q / attn_k / attn_v, or attn_qkv where the model
    has only that (an adapter holds either; TensorRT-LLM module ids 0-3)."""
    separate = all(module_id in targets for module_id in (1, 2, 3))
    return {module_id: target for module_id, target in targets.items() if not (separate and module_id == 0)}


def run_lora_bench(engine_dir: Path, options: LoraBenchOptions = LoraBenchOptions(), *, progress: Any = None) -> dict[str, Any]:
    """Run both sides; the figures, the ratio and its goal (JSON-ready)."""
    import torch

    from refengine import LLMEngine, LoraRequest, LoraSettings
    from refengine.lora.modules import module_name

    say = progress or (lambda line: None)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(options.num_threads)
    try:
        settings = LoraSettings(max_adapter_size=options.rank, max_adapters=options.num_adapters)
        engine = LLMEngine.from_engine_dir(Path(engine_dir), max_batch_size=options.num_requests, lora=settings)
        cache = engine.lora_cache
        targets = projections(cache.targets)
        modules = [module_name(module_id) for module_id in sorted(targets)]
        for task_id in range(options.num_adapters):
            engine.load_lora_adapter(task_id, *random_adapter(targets, cache.shape.num_layers, options.rank, options.seed + task_id))
        workload = make_workload(
            options.num_requests,
            vocab_size=engine.vocab_size,
            prompt_len=options.prompt_len,
            output_mean=options.output_mean,
            output_cap=options.output_cap,
            seed=options.seed,
        )
        adapters = [LoraRequest(index % options.num_adapters) for index in range(options.num_requests)]
        warmup = make_workload(options.num_adapters, vocab_size=engine.vocab_size, prompt_len=(8, 16), output_mean=4, output_cap=8, seed=options.seed + 1)
        run_refengine(engine, warmup)
        run_refengine(engine, warmup, lora=adapters[: options.num_adapters])
        rounds: dict[str, list[SystemRun]] = {"base": [], "lora": []}
        for index in range(options.rounds):
            for name, lora in (("base", None), ("lora", adapters)):
                rounds[name].append(run_refengine(engine, workload, lora=lora))
                say(f"round {index + 1}/{options.rounds} {name}: {rounds[name][-1].figures['tokens_per_s']} tokens/s")
    finally:
        torch.set_num_threads(previous_threads)
    best = {name: max(runs, key=lambda run: run.figures["tokens_per_s"]) for name, runs in rounds.items()}
    ratio = best["lora"].figures["tokens_per_s"] / best["base"].figures["tokens_per_s"]
    cpu_ratio = best["lora"].figures["tokens_per_cpu_s"] / best["base"].figures["tokens_per_cpu_s"]
    round_ratios = [round(lora.figures["tokens_per_s"] / base.figures["tokens_per_s"], 3) for base, lora in zip(rounds["base"], rounds["lora"])]
    median = statistics.median(round_ratios)
    return {
        "recipe": {
            "call": options.call(),
            "engine_dir": str(engine_dir),
            "adapters": f"{options.num_adapters} random adapters of rank {options.rank} on modules {modules} of every layer, cached before the clock starts",
            "workload": workload.summary(),
        },
        "systems": {name: run.figures for name, run in best.items()},
        "rounds": {name: [run.figures["tokens_per_s"] for run in runs] for name, runs in rounds.items()},
        "round_ratios": round_ratios,
        "median_round_ratio": median,
        "adapter_outputs_differ_from_base": sum(best["lora"].outputs[i] != best["base"].outputs[i] for i in best["base"].outputs),
        "ratio_lora_vs_base": round(ratio, 3),
        # With one torch thread, CPU time is the work done; other processes on the machine disturb it far less.
        "ratio_lora_vs_base_per_cpu_s": round(cpu_ratio, 3),
        "target": {"value": median, "goal": GOAL, "met": median >= GOAL},
    }

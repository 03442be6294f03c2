"""Medusa in `bench speculative`: the variant (the built target with a heads directory, engines.py's way) and the
CPU's cost of verifying a tree of N nodes in one target forward (refengine.speculative.medusa_cost), with the heads'
own cost, so that the report shows where the CPU bounds Medusa's speed-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NODE_COUNTS = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64)


def medusa_variant(
    engine_dir: Path, work_dir: Path, heads_dir: Path, medusa_choices: str | None = None, vocab_size: int | None = None, name: str = "medusa"
) -> Path:
    """The target marked for Medusa with `heads_dir` (its tree: `medusa_choices`, else the heads' recommended one;
    `vocab_size` M: the heads propose the first M token ids)."""
    from bench.speculative.engines import linked_copy
    from refengine.speculative.medusa_files import write_medusa_engine
    from refengine.speculative.medusa_tree import parse_medusa_choices

    out = linked_copy(engine_dir, work_dir / name)
    write_medusa_engine(out, heads_dir, parse_medusa_choices(medusa_choices) if medusa_choices else None, medusa_vocab_size=vocab_size)
    return out


def verification_cost(medusa_engine_dir: Path, fp16_weight_gemm: bool, quick: bool) -> dict[str, Any]:
    """Per N the median wall / CPU ms of one verification step at batch 1 and its cost against a plain decode, and the
    heads' cost per step at batch 1 / 4 / 32 (one torch thread, as the bench runs)."""
    import torch

    from refengine import load_engine_dir
    from refengine.model_runner import load_model
    from refengine.speculative.medusa_cost import TREE_WIDTHS, measure_heads, measure_tree_verification
    from refengine.speculative.medusa_heads import MedusaHeads
    from refengine.speculative.settings import SPECULATIVE_KEY

    engine = load_engine_dir(medusa_engine_dir)
    section = json.loads((medusa_engine_dir / "config.json").read_text())[SPECULATIVE_KEY]
    config = engine.checkpoint.config
    repeats, counts = (2, (0, 4, 16)) if quick else (40, NODE_COUNTS)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(engine.checkpoint, torch.float32, fp16_weight_gemm)
        num_heads = section["num_medusa_heads"]
        heads = MedusaHeads.load(
            medusa_engine_dir / section["medusa_heads"],
            num_heads,
            section["num_medusa_layers"],
            config.hidden_size,
            config.vocab_size,
            torch.float32,
            "--medusa",
            fp16_gemm=fp16_weight_gemm,
        )
        top_k = TREE_WIDTHS[:num_heads]
        return {
            "nodes": measure_tree_verification(model, counts, repeats=repeats),
            "heads": [measure_heads(heads, config.hidden_size, top_k, batch, repeats) for batch in (1, 4, 32)],
        }
    finally:
        torch.set_num_threads(previous)


def render_cost(cost: dict[str, Any]) -> str:
    lines = ["| tree nodes N | wall ms / step | CPU ms / step | cost vs a plain decode |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['wall_ms']:.2f} | {r['cpu_ms']:.2f} | {r['relative_cost']:.2f}x |" for r in cost["nodes"]]
    lines += ["", "| heads' proposal at batch | wall ms / step |", "|---:|---:|"]
    lines += [f"| {r['batch_size']} | {r['wall_ms']:.2f} |" for r in cost["heads"]]
    return "\n".join(lines)

"""The CPU's cost of verifying a Medusa tree of N nodes in one target forward (refengine.speculative.medusa_cost),
N = 0 (a plain decode step) ... 64, at batch 1, on a TensorRT-LLM checkpoint, and the heads' cost per step.

    python scripts/medusa_verification_cost.py CHECKPOINT_DIR [--heads HEADS_DIR] [--context 128] [--repeats 40] [--threads 1]

CHECKPOINT_DIR: a TensorRT-LLM checkpoint (e.g. the quantize stage's trtllm_checkpoint of build_configs/tiny-cpu.yaml);
without --heads the heads are random ones of the model's sizes (4 heads, 1 layer: their cost does not depend on their
values). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from refengine import load_checkpoint
from refengine.model_runner import load_model
from refengine.speculative.medusa_cost import TREE_WIDTHS, measure_heads, measure_tree_verification
from refengine.speculative.medusa_files import write_random_medusa_heads
from refengine.speculative.medusa_heads import HEADS_FILE, MedusaHeads

NODE_COUNTS = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--heads", type=Path, help="a Medusa heads directory (default: random heads)")
    parser.add_argument("--context", type=int, default=128, help="tokens in the cache before the verified step")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(load_checkpoint(args.checkpoint), torch.float32, fp16_gemm=True)  # the engine's default GEMMs
    config = model.config
    with tempfile.TemporaryDirectory() as scratch:
        heads_dir = args.heads or write_random_medusa_heads(Path(scratch), 4, 1, config.hidden_size, config.vocab_size)
        heads_config = json.loads((heads_dir / "config.json").read_text())
        num_heads = heads_config["medusa_num_heads"]
        heads = MedusaHeads.load(
            heads_dir / HEADS_FILE,
            num_heads,
            heads_config["medusa_num_layers"],
            config.hidden_size,
            config.vocab_size,
            torch.float32,
            "--heads",
            fp16_gemm=True,
        )
        heads_rows = [measure_heads(heads, config.hidden_size, TREE_WIDTHS[:num_heads], b, args.repeats) for b in (1, 4, 32)]
    rows = measure_tree_verification(model, NODE_COUNTS, args.context, args.repeats)
    print("| tree nodes N | wall ms / step | CPU ms / step | cost vs a plain decode (N = 0) |\n|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['nodes']} | {row['wall_ms']:.2f} | {row['cpu_ms']:.2f} | {row['relative_cost']:.2f}× |")
    print(f"\n| heads ({num_heads}, top-k {list(TREE_WIDTHS[:num_heads])}) at batch | wall ms / step |\n|---:|---:|")
    for row in heads_rows:
        print(f"| {row['batch_size']} | {row['wall_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

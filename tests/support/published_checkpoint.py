"""A ModelOpt-published checkpoint made by the project itself, and the cpu pipeline run on it (issue #46): the default
model quantized to FP8 + FP8 KV by ModelOpt, its unified export kept with the tokenizer (the layout of
`nvidia/...-FP8`) next to the TensorRT-LLM checkpoint the project's own quantize path converts from it."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console

from pipeline.artifacts import ArtifactStore
from pipeline.config.loader import load_config
from pipeline.runner import run_pipeline
from tests.conftest import DEFAULT_MODEL, REPO


def own_fp8_export(root: Path) -> tuple[Path, Path]:
    """(the project's own FP8 + FP8 KV TensorRT-LLM checkpoint of the default model, the unified export it was
    converted from: a ModelOpt-published checkpoint)."""
    from pipeline.quantization.job import make_forward_loop
    from pipeline.quantization.modelopt_export import QuantRecipe, export_trtllm_checkpoint

    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (2, 32), generator=generator).tolist() for _ in range(2)]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        export_trtllm_checkpoint(
            DEFAULT_MODEL,
            root / "checkpoint",
            dtype="float16",
            tp_size=1,
            pp_size=1,
            quant=QuantRecipe("fp8", "fp8"),
            forward_loop=make_forward_loop(batches),
            unified_hf_dir=root / "published",
        )
    finally:
        torch.set_num_threads(previous)
    return root / "checkpoint", root / "published"


def published_config(tmp_path: Path, source: Path, *, target: str = "cpu", algo: str = "none", kv: str = "none", extra: str = "") -> Path:
    """build_configs/tiny-cpu.yaml on `source`, with `extra` YAML appended."""
    text = (REPO / "build_configs" / "tiny-cpu.yaml").read_text()
    text = text.replace("../models/tiny-stdlib-llama", str(source)).replace("target: cpu", f"target: {target}")
    text = text.replace(
        "  algo: none\n  kv_cache: none", f"  algo: {algo}\n  kv_cache: {kv}\n  device: cpu\n  calibration: {{files: ['{REPO}/data/calibration/*.txt']}}"
    )
    path = tmp_path / f"published-{target}-{algo}.yaml"
    path.write_text(text + extra)
    return path


def run_until(config: Path, artifacts: Path, until: str) -> dict:
    loaded = load_config(config)
    results = run_pipeline(loaded, ArtifactStore(artifacts, loaded.spec.name), until=until, console=Console(quiet=True))
    return {r.name: r for r in results}

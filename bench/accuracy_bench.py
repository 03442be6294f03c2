"""Accuracy per quantization format: run the pipeline (quantize → build → accuracy gate) once per
format on the same model and held-out text, and collect each gate's report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from pipeline.artifacts import ArtifactStore
from pipeline.config.loader import load_config
from pipeline.errors import StageError
from pipeline.quant_formats import kv_cache_format, paged_context_fmha_loss, weight_format
from pipeline.runner import run_pipeline

# (quantize.algo, quantize.kv_cache): formats refengine executes on CPU (their records run on target cpu).
FORMATS: tuple[tuple[str, str], ...] = (
    ("int8_wo", "none"),
    ("int8_sq", "none"),
    ("int8_sq", "int8"),
    ("fp8", "none"),
    ("fp8", "fp8"),
    ("int4_awq", "none"),
    ("w4a8_awq", "none"),
)
# Loose thresholds: this benchmark measures, it does not gate.
_MEASURE_ONLY = ("gate.accuracy.max_perplexity_increase_pct=1000", "gate.accuracy.min_token_agreement=0")


def run_accuracy_bench(config: Path, artifacts: Path, *, progress: Callable[[str], None] | None = None) -> dict:
    rows = []
    for label, overrides in (format_run(algo, kv_cache) for algo, kv_cache in FORMATS):
        if progress:
            progress(f"{label}: quantize → build → gate")
        loaded = load_config(config, (*overrides, *_MEASURE_ONLY))
        if loaded.spec.gate.accuracy is None:
            raise StageError(f"{config} has no gate.accuracy section (held-out text and window sizes)")
        results = {r.name: r for r in run_pipeline(loaded, ArtifactStore(artifacts, loaded.spec.name), console=Console(quiet=True))}
        report = json.loads((results["gate"].ref.path / "accuracy.json").read_text())
        keys = ("baseline_perplexity", "perplexity", "perplexity_increase_pct", "token_agreement", "tokens_scored")
        rows.append({"format": label, **{k: report[k] for k in keys}})
    return {"config": str(config), "rows": rows}


def format_run(algo: str, kv_cache: str) -> tuple[str, tuple[str, ...]]:
    """(label, overrides) of one row; the serve features a quantized KV cache rules out are switched off."""
    weights, kv = weight_format(algo), kv_cache_format(kv_cache)
    overrides: tuple[str, ...] = (f"quantize.algo={algo}", f"quantize.kv_cache={kv_cache}")
    if paged_context_fmha_loss(weights, kv) is not None:
        overrides += ("serve.enable_kv_cache_reuse=false", "serve.enable_chunked_context=false")
    return (f"{algo} + {kv_cache} KV" if kv.quantized else algo), overrides


def render_accuracy_markdown(result: dict) -> str:
    lines = [
        "| format | baseline perplexity | perplexity | increase | next-token agreement | tokens scored |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['format']} | {row['baseline_perplexity']:.3f} | {row['perplexity']:.3f} | "
            f"{row['perplexity_increase_pct']:+.2f} % | {row['token_agreement']:.4f} | {row['tokens_scored']} |"
        )
    return "\n".join(lines)

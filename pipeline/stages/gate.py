"""gate: the accuracy gate — perplexity and next-token agreement of the quantized checkpoint vs the
unquantized baseline on held-out text, scored with refengine on CPU. A failed gate seals its
report (verdict "failed"), marks the quantized artifact's manifest, and stops the pipeline.

The baseline is model.source, or gate.accuracy.baseline for a pre-quantized checkpoint served as published
(pipeline.config.gate_baseline: validate requires it there); the report names the format the quantized checkpoint
holds (pipeline.config.effective_quantization), and for a published one, the baseline it was scored against."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from rich.table import Table

from pipeline.artifacts import annotate_manifest
from pipeline.calibration import heldout_files, load_encoder, read_documents
from pipeline.config.effective_quantization import effective_quantize
from pipeline.config.spec import AccuracyGateSpec
from pipeline.errors import StageError
from pipeline.stages.base import StageContext
from pipeline.stages.prepare import checkpoint_dir

REPORT = "accuracy.json"


def run(ctx: StageContext) -> None:
    from pipeline.backends.cpu.accuracy import compare_checkpoints
    from pipeline.quantization.modelopt_export import export_trtllm_checkpoint

    gate = ctx.spec.gate.accuracy
    if gate is None:  # the plan only schedules this stage when the gate is configured
        raise StageError("gate stage scheduled without gate.accuracy")
    prepared = ctx.upstream["prepare"].path
    quantized = ctx.upstream["quantize"].checkpoint_dir
    windows = heldout_windows(gate, prepared)
    quantize = effective_quantize(ctx.spec, checkpoint_dir(prepared))
    source = Path(gate.baseline) if gate.baseline is not None else checkpoint_dir(prepared)
    with tempfile.TemporaryDirectory(prefix="trtllm-pipeline-baseline-") as tmp:
        baseline = Path(tmp) / "baseline"
        ctx.log(f"exporting the unquantized baseline checkpoint from {source}")
        export_trtllm_checkpoint(source, baseline, dtype=ctx.spec.model.dtype.value, tp_size=1, pp_size=1)
        ctx.log(f"scoring {len(windows)} × {gate.window_len} held-out tokens, baseline vs {quantize.algo.value}")
        metrics = compare_checkpoints(baseline, quantized, windows)
    failures = []
    if metrics.perplexity_increase_pct > gate.max_perplexity_increase_pct:
        failures.append(
            f"perplexity increase {metrics.perplexity_increase_pct:.2f}% exceeds gate.accuracy.max_perplexity_increase_pct "
            f"{gate.max_perplexity_increase_pct}% (baseline {metrics.baseline_perplexity:.3f} → {metrics.perplexity:.3f})"
        )
    if metrics.token_agreement < gate.min_token_agreement:
        failures.append(f"token agreement {metrics.token_agreement:.4f} is below gate.accuracy.min_token_agreement {gate.min_token_agreement}")
    verdict = "failed" if failures else "passed"
    report = {
        "verdict": verdict,
        "failures": failures,
        "quant_algo": quantize.algo.value,
        "kv_cache": quantize.kv_cache.value,
        "baseline_perplexity": metrics.baseline_perplexity,
        "perplexity": metrics.perplexity,
        "perplexity_increase_pct": metrics.perplexity_increase_pct,
        "token_agreement": metrics.token_agreement,
        "num_windows": metrics.num_windows,
        "tokens_scored": metrics.tokens_scored,
        "thresholds": {"max_perplexity_increase_pct": gate.max_perplexity_increase_pct, "min_token_agreement": gate.min_token_agreement},
    }
    if gate.baseline is not None:  # a published checkpoint, scored against the unquantized one the spec names
        report["baseline"] = str(gate.baseline)
    (ctx.out_dir / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    ctx.notes.update(verdict=verdict, failures=failures)
    annotate_manifest(ctx.upstream["quantize"].path, "gates", {"accuracy": {"verdict": verdict, "failures": failures, "gate_digest": ctx.plan.digest}})
    ctx.console.print(_table(report))


def heldout_windows(gate: AccuracyGateSpec, tokenizer_dir: Path) -> list[list[int]]:
    encode, eos_id = load_encoder(tokenizer_dir)
    stream: list[int] = []
    for path in heldout_files(gate):
        for document in read_documents(path):
            stream.extend(encode(document))
            if eos_id is not None:
                stream.append(eos_id)
    length, count = gate.window_len, gate.num_windows
    if len(stream) < length:
        raise StageError(f"gate.accuracy: the held-out text has {len(stream)} tokens, fewer than one window (gate.accuracy.window_len {length})")
    last_start = len(stream) - length
    starts = sorted({round(i * last_start / max(1, count - 1)) for i in range(count)})
    return [stream[start : start + length] for start in starts]


def _table(report: dict) -> Table:
    table = Table(title=f"accuracy gate: {report['verdict']}", title_justify="left")
    for column in ("metric", "baseline", report["quant_algo"], "threshold"):
        table.add_column(column)
    thresholds = report["thresholds"]
    table.add_row("perplexity", f"{report['baseline_perplexity']:.3f}", f"{report['perplexity']:.3f}", "")
    table.add_row("perplexity increase", "", f"{report['perplexity_increase_pct']:+.2f}%", f"≤ {thresholds['max_perplexity_increase_pct']}%")
    table.add_row("next-token agreement", "", f"{report['token_agreement']:.4f}", f"≥ {thresholds['min_token_agreement']}")
    return table

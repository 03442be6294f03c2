"""FP8 KV-cache scales clamped to >= 1.0 or not: agreement with the unquantized model, side by side.

ModelOpt 0.47's TensorRT-LLM export clamped FP8 K/V scales to at least 1.0; the converter
(`pipeline/quantization/trtllm_checkpoint/convert.py`, `_kv_cache_scales`) writes the unified export's raw scales.
Per row this benchmark quantizes once with ModelOpt (the build config's calibration), converts the unified checkpoint
as the pipeline does (raw) and writes a copy with the scales clamped (`clamp_fp8=True`), and scores both against the
unquantized checkpoint of the same model on refengine: teacher-forced perplexity and next-token agreement on the
gate's held-out windows, and greedy continuations of held-out prompts compared token by token.

The default model's K/V activations are large enough that the clamp changes every scale (all raw scales are < 1) but
only the smallest cached values lose precision. Where it matters is a model with small K/V activations: the
"K/V ÷ N" rows run the same model re-parametrised so that its K and V are N times smaller and its outputs the same
(k_proj and v_proj weights ÷ N, q_proj and o_proj weights × N; N a power of two, so in fp16 only weights that turn
subnormal round). Those rows keep 16-bit weights (algo none): FP8 weights share one scale over q/k/v (the max), which
would flush the shrunk k/v weights and measure that instead of the KV cache.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from bench.accuracy_bench import format_run
from pipeline.config.loader import load_config
from pipeline.errors import StageError
from pipeline.quantization.dispatch import request_from_spec
from pipeline.quantization.job import run_job
from pipeline.quantization.modelopt_export import export_trtllm_checkpoint
from pipeline.quantization.trtllm_checkpoint.convert import _kv_cache_scales, load_tensors, read_json
from pipeline.quantization.trtllm_checkpoint.layout import layout_for
from pipeline.stages.gate import heldout_windows

DEFAULT_SHRINKS = (64, 512)
_ALGOS = ("fp8", "none")  # quantize.algo of the rows on the model as shipped (each with quantize.kv_cache fp8)
Progress = Callable[[str], None]


def run_kv_clamp_bench(
    config: Path,
    *,
    shrinks: Sequence[int] = DEFAULT_SHRINKS,
    prompt_len: int = 32,
    new_tokens: int = 32,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Rows of clamp vs raw scales on `config`'s model (its calibration and gate.accuracy held-out text)."""
    say = progress or (lambda line: None)
    spec = load_config(config).spec
    if spec.gate.accuracy is None:
        raise StageError(f"{config} has no gate.accuracy section (held-out text and window sizes)")
    for shrink in shrinks:
        if shrink < 1 or shrink & (shrink - 1):
            raise StageError(f"kv-clamp: --shrink {shrink} is not a power of two >= 1 (an exact fp16 re-parametrisation)")
    source = Path(spec.model.source)
    windows = heldout_windows(spec.gate.accuracy, source)
    prompts = [window[:prompt_len] for window in windows]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kv-clamp-bench-") as tmp:
        work = Path(tmp)
        cases = [(1, algo) for algo in _ALGOS] + [(shrink, "none") for shrink in shrinks if shrink > 1]
        for shrink in sorted({s for s, _ in cases}):
            model_dir = source if shrink == 1 else shrink_kv(source, work / f"model-shrink{shrink}", shrink)
            say(f"K/V ÷ {shrink}: unquantized baseline")
            baseline = work / f"baseline-shrink{shrink}"
            export_trtllm_checkpoint(model_dir, baseline, dtype=spec.model.dtype.value, tp_size=1, pp_size=1)
            reference = _Reference(baseline, windows, prompts, new_tokens)
            for algo in (a for s, a in cases if s == shrink):
                say(f"K/V ÷ {shrink}, {algo} + fp8 KV: quantize, convert clamped and raw, score")
                rows.append(_row(config, algo, shrink, model_dir, work / f"{algo}-shrink{shrink}", reference))
    recipe = {"prompt_len": prompt_len, "new_tokens": new_tokens, "windows": len(windows), "window_len": len(windows[0])}
    return {"config": str(config), "recipe": recipe, "rows": rows}


class _Reference:
    """The unquantized checkpoint's teacher-forced scores and greedy continuations, computed once."""

    def __init__(self, checkpoint: Path, windows: list[list[int]], prompts: list[list[int]], new_tokens: int) -> None:
        self.checkpoint, self.windows, self.prompts, self.new_tokens = checkpoint, windows, prompts, new_tokens
        self.greedy = greedy_continuations(checkpoint, prompts, new_tokens)


def _row(config: Path, algo: str, shrink: int, model_dir: Path, work: Path, reference: _Reference) -> dict[str, Any]:
    from pipeline.backends.cpu.accuracy import compare_checkpoints

    spec = load_config(config, format_run(algo, "fp8")[1]).spec
    request = request_from_spec(spec, model_dir, work, result_file=False)
    request = replace(request, tp_size=1, pp_size=1, unified_hf_dir=work / "unified", device="cpu")
    run_job(request)
    raw = request.output_dir  # what the pipeline writes
    clamped = write_kv_scales(raw, work / "unified", work / "clamped", clamp_fp8=True)
    variants = {}
    for name, checkpoint in (("clamped", clamped), ("raw", raw)):
        metrics = compare_checkpoints(reference.checkpoint, checkpoint, reference.windows)
        greedy = greedy_continuations(checkpoint, reference.prompts, reference.new_tokens)
        variants[name] = {
            "kv_scales": kv_cache_scales(checkpoint),
            "perplexity": metrics.perplexity,
            "perplexity_increase_pct": metrics.perplexity_increase_pct,
            "nll_increase": math.log(metrics.perplexity) - math.log(metrics.baseline_perplexity),
            "token_agreement": metrics.token_agreement,
            "tokens_scored": metrics.tokens_scored,
            **greedy_agreement(reference.greedy, greedy),
        }
        baseline_perplexity = metrics.baseline_perplexity
    return {
        "model": "as shipped" if shrink == 1 else f"K/V ÷ {shrink}",
        "shrink": shrink,
        "algo": algo,
        "raw_scales": scale_summary(unified_kv_scales(work / "unified")),
        "baseline_perplexity": baseline_perplexity,
        **variants,
    }


# -- the checkpoints -------------------------------------------------------------------------------------------
def shrink_kv(source: Path, out: Path, factor: int) -> Path:
    """A copy of the Llama-layout model `source` whose K and V activations are `factor` times smaller, same outputs."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors"))
    for path in sorted(source.glob("*.safetensors")):
        tensors = load_file(str(path))
        for name in list(tensors):
            if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
                tensors[name] = tensors[name] / factor
            elif name.endswith(("self_attn.q_proj.weight", "self_attn.o_proj.weight")):
                tensors[name] = tensors[name] * factor
            elif name.endswith(("self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                raise StageError(f"kv-clamp: {path}: {name} (biases or q/k norms) is not re-parametrised here")
        save_file(tensors, str(out / path.name), metadata={"format": "pt"})
    return out


def write_kv_scales(checkpoint: Path, unified: Path, out: Path, *, clamp_fp8: bool) -> Path:
    """A copy of the 1-rank `checkpoint` (converted from `unified`) with the converter's K/V scales, clamped or not."""
    config = read_json(checkpoint / "config.json")
    if int(config["mapping"]["world_size"]) != 1:
        raise StageError(f"kv-clamp: {checkpoint} has {config['mapping']['world_size']} ranks; the benchmark converts 1")
    shutil.copytree(checkpoint, out)
    tensors = load_file(str(out / "rank0.safetensors"))
    hf_tensors = load_tensors(unified)
    layout = layout_for(str(read_json(unified / "config.json").get("model_type")))
    for layer in range(int(config["num_hidden_layers"])):
        prefix = f"transformer.layers.{layer}.attention"
        tensors.update(_kv_cache_scales(hf_tensors, f"{layout.layers}.{layer}", layout, config, prefix, clamp_fp8=clamp_fp8))
    save_file(tensors, str(out / "rank0.safetensors"))
    return out


def unified_kv_scales(unified: Path) -> list[float]:
    """Every `k_scale` / `v_scale` of ModelOpt's unified checkpoint (amax / 448, as exported)."""
    return [float(t) for name, t in sorted(load_tensors(unified).items()) if name.endswith((".k_scale", ".v_scale"))]


def kv_cache_scales(checkpoint: Path) -> list[float]:
    """The `kv_cache_scaling_factor` of every layer of a 1-rank TensorRT-LLM checkpoint (what refengine uses)."""
    tensors = load_file(str(checkpoint / "rank0.safetensors"))
    return [float(t) for name, t in sorted(tensors.items()) if name.endswith(".kv_cache_scaling_factor")]


def scale_summary(scales: list[float]) -> dict[str, Any]:
    return {"count": len(scales), "below_1": sum(s < 1.0 for s in scales), "min": min(scales), "max": max(scales)}


# -- greedy generation -------------------------------------------------------------------------------------------
def greedy_continuations(checkpoint: Path, prompts: list[list[int]], new_tokens: int) -> list[tuple[int, ...]]:
    from refengine import EngineConfig, LLMEngine, SamplingParams

    longest = max(len(p) for p in prompts) + new_tokens
    limits = EngineConfig(max_batch_size=len(prompts), max_input_len=longest, max_seq_len=longest, max_num_tokens=max(512, longest), fp16_weight_gemm=False)
    engine = LLMEngine.from_checkpoint(checkpoint, limits)
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0)
    return [out.outputs[0].token_ids for out in engine.generate(prompts, params)]


def greedy_agreement(reference: list[tuple[int, ...]], candidate: list[tuple[int, ...]]) -> dict[str, Any]:
    """Position-wise agreement of greedy continuations, whole-sequence matches and the mean first divergence."""
    same = sum(sum(a == b for a, b in zip(r, c)) for r, c in zip(reference, candidate))
    total = sum(len(r) for r in reference)
    first = [next((i for i, (a, b) in enumerate(zip(r, c)) if a != b), len(r)) for r, c in zip(reference, candidate)]
    return {
        "greedy_agreement": same / total,
        "greedy_identical": sum(f == len(r) for f, r in zip(first, reference)),
        "greedy_sequences": len(reference),
        "greedy_first_divergence": sum(first) / len(first),
    }


# -- report ------------------------------------------------------------------------------------------------------
def render_kv_clamp_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| model | weights | raw K/V scales (< 1 / all, range) | KV scales | perplexity (baseline) | increase | ΔNLL/token "
        "| next-token agreement | greedy agreement | identical / prompts | first divergence |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        raw = row["raw_scales"]
        scales = f"{raw['below_1']} / {raw['count']}, {raw['min']:.2e}–{raw['max']:.2e}"
        for name in ("clamped", "raw"):
            v = row[name]
            lines.append(
                f"| {row['model']} | {row['algo']} | {scales} | {name} | {v['perplexity']:.3f} ({row['baseline_perplexity']:.3f}) | "
                f"{v['perplexity_increase_pct']:+.2f} % | {v['nll_increase']:+.4f} | {v['token_agreement']:.4f} | "
                f"{v['greedy_agreement']:.4f} | {v['greedy_identical']} / {v['greedy_sequences']} | {v['greedy_first_divergence']:.1f} |"
            )
    return "\n".join(lines)

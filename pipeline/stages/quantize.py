"""quantize: calibrate with ModelOpt (when a format is chosen) and export the TensorRT-LLM checkpoint."""

from __future__ import annotations

import json

from pipeline.calibration import CalibrationSet, build_calibration_set, load_encoder
from pipeline.config.format_rules import needs_calibration
from pipeline.stages.base import StageContext

CHECKPOINT_DIR = "trtllm_checkpoint"
UNIFIED_HF_DIR = "hf_checkpoint"  # for the llmapi target (TensorRT-LLM's PyTorch backend)


def run(ctx: StageContext) -> None:
    from pipeline.backends.modelopt_export import QuantRecipe, export_trtllm_checkpoint

    spec = ctx.spec
    quantize = spec.quantize
    prepared = ctx.upstream["prepare"].path
    recipe = QuantRecipe(quantize.algo.value, quantize.kv_cache.value, quantize.group_size)
    if spec.dry_run:
        _record_dry_run(ctx, recipe)
        return
    forward_loop = None
    if needs_calibration(quantize):
        calibration = load_calibration(ctx)
        forward_loop = _forward_loop(calibration, quantize.calibration.batch_size)
        ctx.notes["calibration"] = calibration.summary()
        ctx.log(
            f"calibration: {len(calibration.windows)} × {quantize.calibration.max_seq_len} tokens from "
            f"{len(calibration.files)} file(s), token-id fingerprint {calibration.fingerprint[:16]}"
        )
    out = ctx.out_dir / CHECKPOINT_DIR
    out.mkdir()
    what = "unquantized" if recipe.algo == "none" and recipe.kv_cache == "none" else f"{recipe.algo} weights, {recipe.kv_cache} KV cache"
    ctx.log(f"{what} → {spec.model.dtype.value} TensorRT-LLM checkpoint (tp={spec.build.tp_size}, pp={spec.build.pp_size}) with ModelOpt")
    config = export_trtllm_checkpoint(
        prepared,
        out,
        dtype=spec.model.dtype.value,
        tp_size=spec.build.tp_size,
        pp_size=spec.build.pp_size,
        quant=recipe,
        forward_loop=forward_loop,
        unified_hf_dir=ctx.out_dir / UNIFIED_HF_DIR if spec.build.target.value == "llmapi" else None,
    )
    ranks = sorted(p.name for p in out.glob("rank*.safetensors"))
    quantization = config.get("quantization", {})
    summary = {"quant_algo": quantization.get("quant_algo"), "kv_cache_quant_algo": quantization.get("kv_cache_quant_algo"), "ranks": ranks}
    ctx.notes["quantization"] = summary
    (ctx.out_dir / "quantize.json").write_text(json.dumps(ctx.notes, indent=2, sort_keys=True) + "\n")
    ctx.log(f"wrote {', '.join(ranks)} (quant_algo {summary['quant_algo']}, kv {summary['kv_cache_quant_algo']})")


def _record_dry_run(ctx: StageContext, recipe) -> None:
    """What the GPU host will run: the recipe and mapping, without loading any weights."""
    spec = ctx.spec
    record = {
        "dry_run": True,
        "recipe": {"algo": recipe.algo, "kv_cache": recipe.kv_cache, "group_size": recipe.group_size},
        "device": spec.quantize.device.value,
        "dtype": spec.model.dtype.value,
        "mapping": {"tp_size": spec.build.tp_size, "pp_size": spec.build.pp_size},
        "calibration": spec.quantize.calibration.model_dump(mode="json"),
        "call": "pipeline.backends.modelopt_export.export_trtllm_checkpoint (ModelOpt mtq.quantize + export_tensorrt_llm_checkpoint)",
    }
    (ctx.out_dir / "quantize.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    ctx.notes.update(dry_run=True, quantization={"quant_algo": recipe.algo, "kv_cache": recipe.kv_cache})
    ctx.log(f"dry run: recorded the {recipe.algo} / KV {recipe.kv_cache} recipe; no checkpoint is exported")


def load_calibration(ctx: StageContext) -> CalibrationSet:
    encode, eos_id = load_encoder(ctx.upstream["prepare"].path)
    return build_calibration_set(ctx.spec.quantize.calibration, encode, eos_id)


def _forward_loop(calibration: CalibrationSet, batch_size: int):
    import torch

    batches = [torch.tensor(batch, dtype=torch.long) for batch in calibration.batches(batch_size)]

    def forward_loop(model) -> None:
        with torch.no_grad():
            for batch in batches:
                model(batch)

    return forward_loop

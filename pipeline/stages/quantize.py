"""quantize: calibrate with ModelOpt (when a format is chosen) and export the TensorRT-LLM checkpoint."""

from __future__ import annotations

import json

from pipeline.config.spec import QuantAlgo
from pipeline.errors import StageError
from pipeline.stages.base import StageContext

CHECKPOINT_DIR = "trtllm_checkpoint"


def run(ctx: StageContext) -> None:
    from pipeline.backends.modelopt_export import export_trtllm_checkpoint

    spec = ctx.spec
    if spec.quantize.algo is not QuantAlgo.none:
        raise StageError(f"quantize.algo {spec.quantize.algo.value!r} is not available in this version; use algo: none")
    prepared = ctx.upstream["prepare"].path
    out = ctx.out_dir / CHECKPOINT_DIR
    out.mkdir()
    ctx.log(f"exporting {spec.model.dtype.value} TensorRT-LLM checkpoint (tp={spec.build.tp_size}, pp={spec.build.pp_size}) with ModelOpt")
    config = export_trtllm_checkpoint(
        prepared,
        out,
        dtype=spec.model.dtype.value,
        tp_size=spec.build.tp_size,
        pp_size=spec.build.pp_size,
        quant=None,
    )
    ranks = sorted(p.name for p in out.glob("rank*.safetensors"))
    world = config.get("mapping", {}).get("world_size", 1)
    if len(ranks) != world:
        raise StageError(f"ModelOpt wrote {len(ranks)} rank file(s) for world_size {world}: {ranks}")
    (ctx.out_dir / "quantize.json").write_text(
        json.dumps({"quant_algo": config.get("quantization", {}).get("quant_algo"), "ranks": ranks}, indent=2) + "\n"
    )
    ctx.log(f"wrote {', '.join(ranks)}")

"""build: turn the TensorRT-LLM checkpoint into an engine directory for the chosen target."""

from __future__ import annotations

from pipeline.artifacts import ENGINE_DIR
from pipeline.backends.base import BuildJob
from pipeline.backends.registry import backend_for
from pipeline.stages.base import StageContext


def run(ctx: StageContext) -> None:
    job = BuildJob(
        spec=ctx.spec,
        model=ctx.model,
        checkpoint_dir=ctx.upstream["quantize"].checkpoint_dir,
        engine_dir=ctx.out_dir / ENGINE_DIR,
        final_engine_dir=(ctx.final_dir or ctx.out_dir) / ENGINE_DIR,
        log=ctx.log,
        draft_engine_dir=ctx.upstream["draft"].engine_dir if "draft" in ctx.upstream else None,
    )
    ctx.notes.update(backend_for(ctx.spec.build.target).build(job))

"""draft: the draft model of draft-target speculative decoding, quantized and built with the model's own code.

The draft's spec is derived from the model's (pipeline.config.spec.draft): the quantize stage's job quantizes its
checkpoint into `trtllm_checkpoint/`, the target's backend builds it into `engine/` (a cpu engine directory, or a
trtllm-build of a plain engine: TensorRT-LLM's draft engine needs no speculative flags of its own). The build stage
copies a cpu draft into the model's engine directory (`<engine>/draft`); the package stage points the engine
target's `tensorrt_llm_draft` model at this one. The draft's weights are read from build.speculative.draft.source,
whose content the plan hashes.
"""

from __future__ import annotations

import dataclasses

from pipeline.artifacts import CHECKPOINT_DIR, ENGINE_DIR
from pipeline.backends.base import BuildJob
from pipeline.backends.registry import backend_for
from pipeline.config.model_info import read_model_info
from pipeline.config.spec.draft import draft_spec
from pipeline.errors import StageError
from pipeline.stages.base import StageContext
from pipeline.stages.quantize import quantize_checkpoint


def run(ctx: StageContext) -> None:
    spec = draft_spec(ctx.spec)
    if spec is None:  # pragma: no cover - the stage applies only with a draft
        raise StageError("the draft stage ran without build.speculative.draft")
    model = read_model_info(spec.model.source)
    if not spec.dry_run and not model.weight_files:
        raise StageError(
            f"build.speculative.draft.source {model.path} has no *.safetensors weights (config-only model directories can be planned, not built)",
            hint="put the draft's checkpoint there (saved with safe_serialization=True), or use --runner dry-run",
        )
    quantize_notes: dict = {}
    draft_ctx = dataclasses.replace(ctx, spec=spec, model=model, notes=quantize_notes)
    quantize_checkpoint(draft_ctx, model.path)
    final_dir = ctx.final_dir or ctx.out_dir
    job = BuildJob(
        spec=spec,
        model=model,
        checkpoint_dir=final_dir / CHECKPOINT_DIR if spec.dry_run else ctx.out_dir / CHECKPOINT_DIR,
        engine_dir=ctx.out_dir / ENGINE_DIR,
        final_engine_dir=final_dir / ENGINE_DIR,
        log=ctx.log,
    )
    build_notes = backend_for(spec.build.target).build(job)
    ctx.notes.update(source=str(model.path), architecture=model.architecture, quantize=quantize_notes, build=build_notes)

"""package: render the Triton model repository for the built engine and check it against it.

Reads: spec.serve, spec.build.target, spec.deploy.gpus (gpu_device_ids of the engine target),
spec.build.speculative (Triton's lookahead parameters); upstream build (engine/) and prepare (the tokenizer). Writes `model_repository/`.
"""

from __future__ import annotations

from pipeline.render import render_model_repository
from pipeline.stages.base import StageContext
from pipeline.stages.build import ENGINE_DIR

REPOSITORY_DIR = "model_repository"


def run(ctx: StageContext) -> None:
    spec = ctx.spec
    engine_dir = (ctx.upstream["build"].path / ENGINE_DIR).resolve()
    tokenizer_dir = ctx.upstream["prepare"].path.resolve()
    written = render_model_repository(
        engine_dir=engine_dir,
        tokenizer_dir=tokenizer_dir,
        serve=spec.serve,
        target=spec.build.target,
        out_dir=ctx.out_dir / REPOSITORY_DIR,
        gpu_device_ids=spec.deploy.gpus,
        dry_run=spec.dry_run,
        speculative=spec.build.speculative,
        draft_engine_dir=(ctx.upstream["draft"].path / ENGINE_DIR).resolve() if "draft" in ctx.upstream else None,
    )
    if spec.dry_run and not (tokenizer_dir / "tokenizer.json").is_file():
        ctx.notes["tokenizer_missing"] = True
        ctx.log(f"[yellow]dry run: no tokenizer.json in {tokenizer_dir}; put the model's tokenizer there before serving[/yellow]")
    models = sorted({path.relative_to(ctx.out_dir / REPOSITORY_DIR).parts[0] for path in written})
    ctx.log(f"{len(models)} models ({', '.join(models)}), {len(written)} files; clients call {spec.serve.model_name!r}")

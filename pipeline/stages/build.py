"""build: turn the TensorRT-LLM checkpoint into an engine directory for the chosen target."""

from __future__ import annotations

from pipeline.backends.cpu import cpu_build_config, resolve_max_seq_len, write_cpu_engine
from pipeline.config.spec import Target
from pipeline.errors import StageError
from pipeline.stages.base import StageContext
from pipeline.stages.quantize import CHECKPOINT_DIR
from pipeline.tools import tool_versions

ENGINE_DIR = "engine"


def run(ctx: StageContext) -> None:
    spec = ctx.spec
    if spec.build.target is Target.engine:
        _build_engine(ctx)
        return
    if spec.build.target is not Target.cpu:  # preflight refuses this before any stage runs
        raise StageError(f"build.target {spec.build.target.value!r} is not available in this version")
    checkpoint = ctx.upstream["quantize"].path / CHECKPOINT_DIR
    max_seq_len = resolve_max_seq_len(spec.build, ctx.model.default_max_seq_len())
    build_config = cpu_build_config(spec.build, max_seq_len=max_seq_len, dtype=spec.model.dtype.value, quantize=spec.quantize)
    write_cpu_engine(checkpoint, ctx.out_dir / ENGINE_DIR, build_config=build_config, version=tool_versions()["trtllm_pipeline"])
    ctx.log(
        f"cpu engine: max_batch_size {build_config['max_batch_size']}, max_seq_len {max_seq_len}, "
        f"max_num_tokens {build_config['max_num_tokens']}, tokens_per_block {spec.build.tokens_per_block}"
    )


def _build_engine(ctx: StageContext) -> None:
    from pipeline.backends.engine_target import run_engine_build, target_sm

    checkpoint = ctx.upstream["quantize"].path / CHECKPOINT_DIR
    final = (ctx.final_dir or ctx.out_dir) / ENGINE_DIR
    build, outcome = run_engine_build(ctx.spec, ctx.model, checkpoint, ctx.out_dir / ENGINE_DIR, final)
    for decision in build.decisions:
        ctx.log(f"[yellow]{decision.kind}[/yellow] {decision.field}: {decision.requested!r} → {decision.applied!r} ({decision.reason})")
    ctx.notes.update(
        trtllm_version=build.version.version,
        image=build.version.image,
        gpu=ctx.spec.deploy.gpu.value if ctx.spec.deploy.gpu is not None else None,
        compute_capability=target_sm(ctx.spec),  # SM of that GPU (90 = 9.0): `serve` and the container check it
        runner=ctx.spec.build.runner.value,
        dry_run=outcome.dry_run,
        command=list(outcome.command),
        decisions=[decision.to_json() for decision in build.decisions],
    )
    what = "wrote the trtllm-build command and engine config (dry run)" if outcome.dry_run else "built the engine"
    ctx.log(f"TensorRT-LLM {build.version.version}: {what}")

"""package: render the Triton model repository for the built engine and check it against it.

Reads: spec.serve, spec.build.target, spec.deploy.gpus (gpu_device_ids of the engine target),
spec.build.speculative (Triton's lookahead parameters); upstream build (engine/) and prepare (the tokenizer, and
config.json for the capacity planner). Writes `model_repository/`.

The instance counts of preprocessing, postprocessing and the BLS that the spec leaves unset are planned here, on a
target that streams at a GPU's pace (pipeline.capacity.for_spec: the GPU's token rate ÷ one instance's measured
rate; then the planner also reads build, quantize and deploy.gpu, which the build stage's digest hashes); the
reasoning goes to the stage's log.
"""

from __future__ import annotations

from pipeline.artifacts import REPOSITORY_DIR
from pipeline.backends.registry import backend_for
from pipeline.capacity.for_spec import planned_python_instances
from pipeline.config.model_info import read_model_info
from pipeline.render import RepositoryRequest, render_model_repository
from pipeline.render.llmapi_repository import render_openai_form
from pipeline.stages.base import StageContext

SERVE_DIR = "trtllm_serve"  # a target in NVIDIA's llmapi layout: the trtllm-serve form of the same options


def run(ctx: StageContext) -> None:
    spec = ctx.spec
    engine_dir = ctx.upstream["build"].engine_dir.resolve()
    tokenizer_dir = ctx.upstream["prepare"].path.resolve()
    instances, reasoning = planned_python_instances(spec, read_model_info(tokenizer_dir))
    for line in reasoning:
        ctx.log(line)
    written = render_model_repository(
        RepositoryRequest(
            engine_dir=engine_dir,
            tokenizer_dir=tokenizer_dir,
            serve=spec.serve,
            target=spec.build.target,
            out_dir=ctx.out_dir / REPOSITORY_DIR,
            gpu_device_ids=spec.deploy.gpus,
            dry_run=spec.dry_run,
            speculative=spec.build.speculative,
            draft_engine_dir=ctx.upstream["draft"].engine_dir.resolve() if "draft" in ctx.upstream else None,
            final_out_dir=(ctx.final_dir or ctx.out_dir) / REPOSITORY_DIR,
            python_instances=instances,
        )
    )
    llm_api = backend_for(spec.build.target).llm_api
    if llm_api is not None:  # its second form: trtllm-serve with the same LLM() options
        serve_dir = ctx.out_dir / SERVE_DIR
        written += render_openai_form(llm_api, engine_dir=engine_dir, serve=spec.serve, out_dir=serve_dir, model_path=str(engine_dir))
        final_serve_dir = (ctx.final_dir or ctx.out_dir) / SERVE_DIR
        ctx.log(f"trtllm-serve: {' '.join(llm_api.openai_command(str(engine_dir), str(final_serve_dir / llm_api.openai_options_file)))}")
    if spec.dry_run and not (tokenizer_dir / "tokenizer.json").is_file():
        ctx.notes["tokenizer_missing"] = True
        ctx.log(f"[yellow]dry run: no tokenizer.json in {tokenizer_dir}; put the model's tokenizer there before serving[/yellow]")
    models = sorted({path.relative_to(ctx.out_dir / REPOSITORY_DIR).parts[0] for path in written if path.is_relative_to(ctx.out_dir / REPOSITORY_DIR)})
    called = llm_api.model_name if llm_api is not None else spec.serve.model_name
    ctx.log(f"{len(models)} models ({', '.join(models)}), {len(written)} files; clients call {called!r}")

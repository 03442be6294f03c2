"""deploy: render the deployment of deploy.kind (compose: Triton, Prometheus, Grafana; kubernetes: manifests) for the packaged model.

Reads: spec.deploy, spec.serve, spec.build (target, TensorRT-LLM version, tp/pp), spec.name;
upstream prepare (the tokenizer), build (engine/) and package (model_repository/, whose file list
the container's repository must match). Writes `deploy/` (layout in pipeline.deploy.layout); its
`engine` and `tokenizer` entries are relative links to the upstream artifacts. The kind's deployer
(pipeline.deploy.registry) renders and checks it.
"""

from __future__ import annotations

import ipaddress

from pipeline.artifacts import DEPLOY_DIR
from pipeline.deploy.base import DeploymentInputs
from pipeline.deploy.images import server_image
from pipeline.deploy.registry import deployer_for
from pipeline.errors import StageError
from pipeline.stages.base import StageContext


def run(ctx: StageContext) -> None:
    spec = ctx.spec
    final = (ctx.final_dir or ctx.out_dir) / DEPLOY_DIR
    deployer = deployer_for(spec.deploy.kind)
    inputs = DeploymentInputs(
        engine_dir=ctx.upstream["build"].engine_dir.resolve(),
        tokenizer_dir=ctx.upstream["prepare"].path.resolve(),
        package_repository=ctx.upstream["package"].repository_dir,
        final_dir=final,
        draft_engine_dir=ctx.upstream["draft"].engine_dir.resolve() if "draft" in ctx.upstream else None,
    )
    deployment = deployer.render(spec, inputs, ctx.out_dir / DEPLOY_DIR)
    problems = deployer.check(deployment.directory)
    if problems:
        raise StageError(f"the written {deployment.summary} has problems:\n  " + "\n  ".join(problems), hint="this is a bug in pipeline.deploy")
    image = server_image(spec, spec.build.target.value)
    ctx.notes.update(deployment.notes)
    ctx.notes.update(
        image=image.reference,
        image_pinned_by_digest=image.pinned_by_digest,
        bind_address=spec.deploy.bind_address,
    )
    ctx.log(f"{deployment.summary}: {final}")
    if not image.pinned_by_digest:
        ctx.log(f"[yellow]image not pinned by digest[/yellow]: {image.reference} ({image.note})")
    if not ipaddress.ip_address(spec.deploy.bind_address).is_loopback:
        ctx.log(f"[yellow]Triton's ports are published on {spec.deploy.bind_address}, not loopback[/yellow]: put an authenticating proxy in front of them")
    ctx.log(f"start it with: {deployment.start}")

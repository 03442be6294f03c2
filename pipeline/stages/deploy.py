"""deploy: render the docker compose deployment (Triton, Prometheus, Grafana) for the packaged model.

Reads: spec.deploy, spec.serve, spec.build (target, TensorRT-LLM version, tp/pp), spec.name;
upstream prepare (the tokenizer), build (engine/) and package (model_repository/, whose file list
the container's repository must match). Writes `deploy/` (layout in pipeline.deploy.layout); its
`engine` and `tokenizer` entries are relative links to the upstream artifacts.
"""

from __future__ import annotations

import ipaddress

from pipeline.deploy import write_deployment
from pipeline.deploy.images import server_image
from pipeline.stages.base import StageContext
from pipeline.stages.build import ENGINE_DIR
from pipeline.stages.package import REPOSITORY_DIR

DEPLOY_DIR = "deploy"


def run(ctx: StageContext) -> None:
    spec = ctx.spec
    final = (ctx.final_dir or ctx.out_dir) / DEPLOY_DIR
    deployment = write_deployment(
        spec,
        ctx.out_dir / DEPLOY_DIR,
        engine_dir=(ctx.upstream["build"].path / ENGINE_DIR).resolve(),
        tokenizer_dir=ctx.upstream["prepare"].path.resolve(),
        link_base=final,
        package_repository=ctx.upstream["package"].path / REPOSITORY_DIR,
    )
    image = server_image(spec, deployment.target)
    ctx.notes.update(
        profile=deployment.profile,
        image=image.reference,
        image_pinned_by_digest=image.pinned_by_digest,
        bind_address=spec.deploy.bind_address,
    )
    ctx.log(f"docker compose deployment, profile {deployment.profile}: {final}")
    if not image.pinned_by_digest:
        ctx.log(f"[yellow]image not pinned by digest[/yellow]: {image.reference} ({image.note})")
    if not ipaddress.ip_address(spec.deploy.bind_address).is_loopback:
        ctx.log(
            f"[yellow]Triton's ports are published on {spec.deploy.bind_address}, not loopback[/yellow]: "
            "put an authenticating proxy in front of them"
        )
    ctx.log(f"start it with: cd {final} && docker compose --profile {deployment.profile} up -d")

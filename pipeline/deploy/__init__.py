"""The docker compose deployment: Triton (profile cpu or gpu), Prometheus and Grafana, rendered from a spec.

    render_compose(spec, model_repository=…, engine_dir=…, target=…)   the compose document (a dict)
    write_deployment(spec, out_dir, engine_dir=…, tokenizer_dir=…)     the whole deployment directory
    render_root_compose(spec)                                        the checkout's docker-compose.yml
    export_deployment(artifact_deploy_dir, Path("deploy"))           copy a deployment out of the store
    compose_up(deploy_dir, profile)                                  docker compose up -d
"""

from pipeline.deploy.checks import check_compose, lint_compose
from pipeline.deploy.compose import dump_compose, render_compose, render_root_compose
from pipeline.deploy.layout import COMPOSE_FILE, profile_for
from pipeline.deploy.up import compose_up
from pipeline.deploy.writer import Deployment, export_deployment, write_deployment

__all__ = [
    "COMPOSE_FILE",
    "Deployment",
    "check_compose",
    "compose_up",
    "dump_compose",
    "export_deployment",
    "lint_compose",
    "profile_for",
    "render_compose",
    "render_root_compose",
    "write_deployment",
]

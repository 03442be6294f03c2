"""deploy.kind compose: the docker compose deployment, Triton (profile cpu or gpu), Prometheus and Grafana.

ComposeDeployer()                                                the kind's Deployer (pipeline.deploy.base)
render_compose(spec, model_repository=…, engine_dir=…, target=…)   the compose document (a dict)
write_deployment(spec, out_dir, engine_dir=…, tokenizer_dir=…)     the whole deployment directory
render_root_compose(spec)                                        the checkout's docker-compose.yml
export_deployment(artifact_deploy_dir, Path("deploy"))           copy a deployment out of the store
compose_up(deploy_dir, profile)                                  docker compose up -d
"""

from pipeline.deploy.compose.checks import check_compose, lint_compose
from pipeline.deploy.compose.deployer import ComposeDeployer
from pipeline.deploy.compose.document import dump_compose, render_compose, render_root_compose
from pipeline.deploy.compose.layout import COMPOSE_FILE, ENV_FILE, profile_for
from pipeline.deploy.compose.up import compose_up
from pipeline.deploy.compose.writer import ComposeDeployment, export_deployment, write_deployment

__all__ = [
    "COMPOSE_FILE",
    "ENV_FILE",
    "ComposeDeployer",
    "ComposeDeployment",
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

"""The deploy-kind seam: every deploy.kind has a deployer, and compose's renders, checks, exports and starts
through the interface the deploy stage and `trtllm-pipeline deploy` use (pipeline.deploy.base)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.spec import DeployKind
from pipeline.deploy.base import DeploymentInputs
from pipeline.deploy.compose import COMPOSE_FILE, ENV_FILE, ComposeDeployer
from pipeline.deploy.registry import DEPLOYERS, deployer_for
from pipeline.errors import SpecError
from tests.pipeline.deploy.test_deploy import SECRETS, load_spec, package_repository, render_text, tiny_engine, tokenizer


def test_every_deploy_kind_has_its_deployer():
    assert set(DEPLOYERS) == set(DeployKind)
    for kind in DeployKind:
        assert deployer_for(kind).kind is kind


def test_compose_is_the_default_kind():
    assert load_spec("tiny-cpu").deploy.kind is DeployKind.compose


@pytest.fixture
def rendered(tmp_path):
    spec = load_spec("tiny-cpu")
    engine = tiny_engine(tmp_path / "build" / "engine")
    tokenizer_dir = tokenizer(tmp_path / "prepare")
    package = package_repository(spec, engine, tokenizer_dir, tmp_path / "package" / "model_repository")
    final = tmp_path / "deploy-d" / "deploy"
    inputs = DeploymentInputs(engine, tokenizer_dir, package_repository=package, final_dir=final, secrets=SECRETS)
    deployer = ComposeDeployer()
    return spec, deployer, deployer.render(spec, inputs, tmp_path / "tmp" / "deploy"), final


def test_compose_renders_what_write_deployment_writes(rendered):
    spec, deployer, deployment, final = rendered
    assert (deployment.directory / COMPOSE_FILE).read_text() == render_text("tiny-cpu")
    assert deployment.directory / COMPOSE_FILE in deployment.files and deployment.notes == {"profile": "cpu"}
    assert deployment.summary == "docker compose deployment, profile cpu"
    assert deployment.start == f"cd {final} && docker compose --profile cpu up -d"
    assert deployer.check(deployment.directory) == []


def test_compose_check_reads_the_written_files(rendered):
    spec, deployer, deployment, _ = rendered
    env = deployment.directory / ENV_FILE
    env.write_text("".join(line + "\n" for line in env.read_text().splitlines() if not line.startswith("TRITON_ADMIN_KEY=")))
    problems = deployer.check(deployment.directory)
    assert problems and all("TRITON_ADMIN_KEY" in problem for problem in problems)
    (deployment.directory / COMPOSE_FILE).unlink()
    assert deployer.check(deployment.directory) == [f"{deployment.directory} lacks {COMPOSE_FILE}"]


def test_compose_exports_and_names_the_command_that_starts_the_copy(rendered, tmp_path: Path):
    spec, deployer, deployment, _ = rendered
    out = tmp_path / "checkout" / "deploy"
    out.parent.mkdir()
    deployer.export(deployment.directory, out)
    assert deployer.check(out) == []
    assert deployer.start_command(spec, out) == f"docker compose --env-file {out}/.env --profile cpu -f {out}/docker-compose.yml up -d"


def test_kubernetes_renders_checks_and_exports_through_the_interface(tmp_path: Path):
    from pipeline.config.spec import Spec
    from pipeline.deploy.kubernetes import KubernetesDeployer, rendered_files

    data = load_spec("tiny-cpu").model_dump(mode="json")
    data["deploy"]["kind"] = "kubernetes"
    spec = Spec.model_validate(data)
    engine = tiny_engine(tmp_path / "build" / "engine")
    tokenizer_dir = tokenizer(tmp_path / "prepare")
    package = package_repository(spec, engine, tokenizer_dir, tmp_path / "package" / "model_repository")
    final = tmp_path / "deploy-d" / "deploy"
    inputs = DeploymentInputs(engine, tokenizer_dir, package_repository=package, final_dir=final, secrets=SECRETS)
    deployer = deployer_for(DeployKind.kubernetes)
    deployment = deployer.render(spec, inputs, tmp_path / "tmp" / "deploy")
    directory = deployment.directory
    assert isinstance(deployer, KubernetesDeployer) and deployer.check(directory) == []
    for path, text in rendered_files(spec).items():
        assert (directory / path).read_text() == text
    secret = directory / "kubernetes" / "base" / "secret.env"
    assert (secret.stat().st_mode & 0o777) == 0o600 and f"TRITON_ADMIN_KEY={SECRETS['TRITON_ADMIN_KEY']}" in secret.read_text()
    assert f"TRTLLM_PIPELINE_API_KEYS={SECRETS['TRTLLM_PIPELINE_API_KEYS']}\n" in secret.read_text()
    assert (directory / "prometheus" / "rules.yml").is_file() and (directory / "Dockerfile").is_file()
    assert deployment.summary == "kubernetes deployment (Deployment, overlay monitoring)"
    assert deployment.start == f"kubectl apply -k {final}/kubernetes/overlays/monitoring"
    out = tmp_path / "checkout" / "deploy"
    out.parent.mkdir()
    deployer.export(directory, out)
    assert deployer.check(out) == [] and deployer.start_command(spec, out) == f"kubectl apply -k {out}/kubernetes/overlays/monitoring"
    with pytest.raises(SpecError, match="docker compose options"):
        deployer.up(spec, out, services=["triton"])

"""deploy.kind compose: the Deployer (pipeline.deploy.base) of the docker compose deployment."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config.spec import DeployKind, Spec
from pipeline.deploy.base import Deployment, DeploymentInputs
from pipeline.deploy.compose.checks import lint_compose
from pipeline.deploy.compose.layout import COMPOSE_FILE, ENV_FILE, profile_for
from pipeline.deploy.compose.up import compose_up
from pipeline.deploy.compose.writer import export_deployment, read_env, write_deployment


@dataclass(frozen=True)
class ComposeDeployer:
    kind: DeployKind = DeployKind.compose

    def render(self, spec: Spec, inputs: DeploymentInputs, out_dir: Path) -> Deployment:
        written = write_deployment(
            spec,
            out_dir,
            engine_dir=inputs.engine_dir,
            tokenizer_dir=inputs.tokenizer_dir,
            link_base=inputs.final_dir,
            package_repository=inputs.package_repository,
            secrets=inputs.secrets,
            source_root=inputs.source_root,
            draft_engine_dir=inputs.draft_engine_dir,
        )
        final = inputs.final_dir or out_dir
        return Deployment(
            directory=out_dir,
            files=written.files,
            summary=f"docker compose deployment, profile {written.profile}",
            start=f"cd {final} && docker compose --profile {written.profile} up -d",
            notes={"profile": written.profile},
        )

    def check(self, directory: Path) -> list[str]:
        """The written docker-compose.yml, as compose reads it, against the variables of its .env."""
        missing = [name for name in (COMPOSE_FILE, ENV_FILE) if not (directory / name).is_file()]
        if missing:
            return [f"{directory} lacks {', '.join(missing)}"]
        try:
            document = yaml.safe_load((directory / COMPOSE_FILE).read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            return [f"{directory / COMPOSE_FILE}: not YAML ({error})"]
        if not isinstance(document, dict):
            return [f"{directory / COMPOSE_FILE}: not a compose document (a mapping)"]
        return lint_compose(document, env=read_env(directory / ENV_FILE))

    def export(self, source: Path, destination: Path) -> Path:
        return export_deployment(source, destination)

    def start_command(self, spec: Spec, directory: Path) -> str:
        profile = profile_for(spec.build.target.value)
        return f"docker compose --env-file {directory}/{ENV_FILE} --profile {profile} -f {directory}/{COMPOSE_FILE} up -d"

    def up(self, spec: Spec, directory: Path, *, services: Sequence[str] = (), extra_files: Sequence[Path] = ()) -> str:
        return compose_up(directory, profile_for(spec.build.target.value), services=services, extra_files=extra_files)

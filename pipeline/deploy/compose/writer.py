"""Write a docker compose deployment directory (layout in pipeline.deploy.compose.layout), and copy one out of
the artifact store. The pieces every deployment holds (the container's repository, the links to the
engine and tokenizer, monitoring, the server image's files) come from pipeline.deploy.files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import files, layout
from pipeline.deploy.compose.checks import check_compose
from pipeline.deploy.compose.document import deployment_header, dump_compose, render_compose
from pipeline.deploy.compose.layout import COMPOSE_FILE, ENV_FILE, profile_for, project_name


@dataclass(frozen=True)
class ComposeDeployment:
    directory: Path
    target: str
    profile: str
    compose: dict[str, Any]
    files: tuple[Path, ...]  # regular files written (the links are not files)


def write_deployment(
    spec: Spec,
    out_dir: Path,
    *,
    engine_dir: Path,
    tokenizer_dir: Path,
    link_base: Path | None = None,
    package_repository: Path | None = None,
    secrets: Mapping[str, str] | None = None,
    source_root: Path | None = None,
    draft_engine_dir: Path | None = None,
) -> ComposeDeployment:
    """Render and write everything; `link_base` is where `out_dir` will finally live (links are relative to it)."""
    target = spec.build.target.value
    profile = profile_for(target)
    files.require_new_directory(out_dir)
    document = render_compose(
        spec,
        model_repository=Path(layout.MODEL_REPOSITORY_DIR),
        engine_dir=Path(layout.ENGINE_LINK),
        tokenizer_dir=Path(layout.TOKENIZER_LINK),
        target=target,
        draft_engine_dir=Path(layout.DRAFT_ENGINE_LINK) if draft_engine_dir is not None else None,
    )
    env = env_values(spec, target, secrets)
    check_compose(document, env=env)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = files.write_container_repository(
        spec,
        out_dir,
        engine_dir=engine_dir,
        tokenizer_dir=tokenizer_dir,
        package_repository=package_repository,
        draft_engine_dir=draft_engine_dir,
    )
    files.link_upstream(out_dir, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, base=link_base or out_dir, draft_engine_dir=draft_engine_dir)
    written.append(files.write_file(out_dir / COMPOSE_FILE, dump_compose(document, deployment_header(spec, target))))
    written.append(files.write_file(out_dir / ENV_FILE, render_env(env, spec, target), mode=0o600))
    written += files.write_monitoring(out_dir, spec, target)
    written += files.write_server_files(out_dir, spec, target, source_root)
    return ComposeDeployment(out_dir, target, profile, document, tuple(sorted(written)))


def env_values(spec: Spec, target: str, secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """What .env holds: the compose project and profile, and the secrets (random unless given)."""
    values = {"COMPOSE_PROJECT_NAME": project_name(spec.name), "COMPOSE_PROFILES": profile_for(target)}
    return {**values, **files.secret_values(secrets)}


def render_env(values: Mapping[str, str], spec: Spec, target: str) -> str:
    lines = [
        f"# Rendered by trtllm-pipeline (deploy stage) for build {spec.name!r}, target {target}.",
        "# Holds secrets: keep this file private (mode 0600) and out of version control.",
        f"# {layout.ADMIN_KEY_VARIABLE}: value of the '{layout.ADMIN_KEY_HEADER}' header the Triton admin APIs require.",
        f"# {layout.GRAFANA_PASSWORD_VARIABLE}: Grafana's 'admin' password.",
        f"# {layout.OPENAI_API_KEYS_VARIABLE}: the OpenAI front end's API keys, KEY or NAME:KEY, comma-separated; clients send one",
        "#   as 'Authorization: Bearer KEY'. To rotate: add the new key, `docker compose up -d openai`, move the clients,",
        "#   remove the old key, `docker compose up -d openai` again (docs/api-keys.md).",
    ]
    lines += [f"{key}={value}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def read_env(path: Path) -> dict[str, str]:
    """The variables of a .env file as render_env writes it (KEY=VALUE lines, # comments)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def export_deployment(source: Path, destination: Path) -> Path:
    """Copy a deployment directory to `destination` (e.g. ./deploy), replacing an earlier export."""
    return files.export_directory(source, destination, main_file=COMPOSE_FILE)

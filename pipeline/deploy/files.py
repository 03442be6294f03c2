"""What every deployment directory holds, whatever its kind (layout in pipeline.deploy.layout).

The Triton repository is rendered again for the container: the package stage's repository names
the engine and tokenizer by their host paths (for `trtllm-pipeline serve`), and its GPU ids are
host ids, while inside the container the engine is /engine, the tokenizer /tokenizer, and the
reserved GPUs are numbered from 0. The same renderer and checks produce it, and its files must be
the package repository's files.

The engine and tokenizer are not copied (a 70B engine is tens of GB): `engine` and `tokenizer`
are relative symlinks to the upstream artifacts; the container runtime mounts what they point at.
"""

from __future__ import annotations

import json
import os
import re
import secrets as token_source
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from clients.api_keys import ApiKeyError, parse_api_keys
from pipeline.backends.engine import runtime as engine_runtime
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec
from pipeline.deploy import dockerfile, images, layout, monitoring, rule_tests, rules
from pipeline.errors import StageError
from pipeline.render import ConfigPaths, RepositoryRequest, render_model_repository
from pipeline.render.llmapi_repository import render_openai_form

SECRET_VARIABLES = (layout.ADMIN_KEY_VARIABLE, layout.GRAFANA_PASSWORD_VARIABLE, layout.OPENAI_API_KEYS_VARIABLE)
# The admin key ends up inside `--http-restricted-api=<apis>:<header>=<key>`: no `,`, `:`, `=` or `$`.
_SECRET = re.compile(r"^[A-Za-z0-9_-]{16,}$")
EXPORT_MARKER = ".trtllm-pipeline-deployment"


def secret_values(secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """The deployment's secrets: the given ones (checked), random ones otherwise. The OpenAI front end's API keys are
    a list in clients.api_keys' syntax (generated: one key, `default:<random>`); the others single tokens."""
    given = dict(secrets or {})
    unknown = sorted(set(given) - set(SECRET_VARIABLES))
    if unknown:
        raise StageError(f"unknown deployment secret(s) {', '.join(unknown)}; known: {', '.join(SECRET_VARIABLES)}")
    values = {}
    for name in SECRET_VARIABLES:
        if name == layout.OPENAI_API_KEYS_VARIABLE:
            values[name] = _api_keys_value(given.get(name))
            continue
        value = given.get(name) or token_source.token_urlsafe(24)
        if not _SECRET.match(value):
            raise StageError(f"{name} must be at least 16 characters of A-Z a-z 0-9 _ - (it is passed on a command line)")
        values[name] = value
    return values


def _api_keys_value(given: str | None) -> str:
    if not given:
        return f"{layout.GENERATED_API_KEY_NAME}:{token_source.token_urlsafe(24)}"
    try:
        parse_api_keys(given, f"the deployment secret {layout.OPENAI_API_KEYS_VARIABLE}")
    except ApiKeyError as error:
        raise StageError(str(error)) from None
    if "\n" in given:  # .env and secret.env hold one line per variable
        raise StageError(f"the deployment secret {layout.OPENAI_API_KEYS_VARIABLE} must be one line: separate its keys with commas")
    return given


def require_new_directory(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise StageError(f"{out_dir} is not empty; a deployment is written into a new directory")


def write_container_repository(
    spec: Spec,
    out_dir: Path,
    *,
    engine_dir: Path,
    tokenizer_dir: Path,
    package_repository: Path | None,
    draft_engine_dir: Path | None = None,
) -> list[Path]:
    """`model_repository/` as the container sees it; its files must be the package stage's."""
    repository = out_dir / layout.MODEL_REPOSITORY_DIR
    written = render_model_repository(
        RepositoryRequest(
            engine_dir=engine_dir,
            tokenizer_dir=tokenizer_dir,
            serve=spec.serve,
            target=spec.build.target,
            out_dir=repository,
            gpu_device_ids=tuple(range(len(spec.deploy.gpus))),  # the reserved GPUs, as the container numbers them
            config_paths=ConfigPaths(layout.ENGINE_MOUNT, layout.TOKENIZER_MOUNT, layout.MODELS_MOUNT),
            dry_run=spec.dry_run,
            speculative=spec.build.speculative,
            draft_engine_dir=draft_engine_dir,
            draft_config_dir=layout.DRAFT_ENGINE_MOUNT,
        )
    )
    if package_repository is not None:
        _check_same_files(repository, package_repository)
    llm_api = backend_for(spec.build.target).llm_api
    if llm_api is not None:  # the trtllm-serve form of the same LLM() options, for its service
        written += render_openai_form(
            llm_api, engine_dir=engine_dir, serve=spec.serve, out_dir=out_dir / layout.OPENAI_FORM_DIR, model_path=layout.ENGINE_MOUNT
        )
    return written


def link_upstream(out_dir: Path, *, engine_dir: Path, tokenizer_dir: Path, base: Path, draft_engine_dir: Path | None = None) -> None:
    """`engine` and `tokenizer` (and `draft_engine`): links relative to `base` (where `out_dir` will finally live)."""
    _link(out_dir / layout.ENGINE_LINK, engine_dir, base)
    _link(out_dir / layout.TOKENIZER_LINK, tokenizer_dir, base)
    if draft_engine_dir is not None:
        _link(out_dir / layout.DRAFT_ENGINE_LINK, draft_engine_dir, base)


def write_monitoring(out_dir: Path, spec: Spec, target: str) -> list[Path]:
    def as_yaml(data: dict[str, Any]) -> str:
        return "# Rendered by trtllm-pipeline (deploy stage). Do not edit.\n" + yaml.safe_dump(data, sort_keys=False, width=4096)

    return [
        write_file(out_dir / layout.PROMETHEUS_CONFIG, as_yaml(monitoring.prometheus_config(spec, target))),
        write_file(out_dir / rules.RULES_FILE, as_yaml(rules.rules_document(spec))),
        write_file(out_dir / rules.RULES_TEST_FILE, as_yaml(rule_tests.rules_test_document(spec))),
        write_file(out_dir / layout.GRAFANA_DATASOURCES, as_yaml(monitoring.grafana_datasources())),
        write_file(out_dir / layout.GRAFANA_DASHBOARD_PROVIDERS, as_yaml(monitoring.grafana_dashboard_providers())),
        write_file(out_dir / layout.GRAFANA_DASHBOARD, json.dumps(monitoring.dashboard(spec, target), indent=2) + "\n"),
    ]


def write_server_files(out_dir: Path, spec: Spec, target: str, source_root: Path | None = None) -> list[Path]:
    """The engine container's entrypoint check, and the build context (Dockerfile and project source) of the image with
    the project installed: the cpu target's server, and on either target the OpenAI front end."""
    written = []
    facts = layout.container_facts(target)
    if facts.checks_engine_in_container:
        written.append(write_file(out_dir / layout.ENGINE_CHECK_FILE, Path(engine_runtime.__file__).read_text(encoding="utf-8")))
    if facts.image_has_project:
        base = images.server_image(spec, target)
    else:  # the OpenAI front end's image (the engine target's Triton runs NGC's image)
        base = images.ServerImage(images.PYTHON_BASE_IMAGE, True, "Python base of the OpenAI front end's image")
    return written + write_project_image(out_dir, spec, base, source_root)


def write_project_image(out_dir: Path, spec: Spec, base_image: images.ServerImage, source_root: Path | None = None) -> list[Path]:
    """The build context of the image with the project installed (the cpu server; the OpenAI front end)."""
    text = dockerfile.render_dockerfile(
        build_name=spec.name, base_image=base_image.reference, base_image_note=base_image.note, torch_index=spec.deploy.torch_index_url
    )
    written = [write_file(out_dir / layout.DOCKERFILE, text), write_file(out_dir / layout.DOCKERIGNORE, dockerfile.DOCKERIGNORE)]
    return written + dockerfile.copy_project_source(out_dir / layout.SOURCE_DIR, source_root)


def write_file(path: Path, text: str, *, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)  # the umask may have removed bits
    return path


def _link(link: Path, target: Path, base: Path) -> None:
    if not target.is_dir():
        raise StageError(f"{target} is not a directory; the deployment mounts it")
    relative = os.path.relpath(target.resolve(), base.resolve())
    link.symlink_to(relative, target_is_directory=True)


def _relative_files(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts}


def _check_same_files(rendered: Path, package_repository: Path) -> None:
    if not package_repository.is_dir():
        raise StageError(f"the package stage's model repository {package_repository} is missing")
    ours, theirs = _relative_files(rendered), _relative_files(package_repository)
    if ours != theirs:
        raise StageError(
            f"the repository rendered for the container differs from the package stage's: only here: "
            f"{sorted(ours - theirs) or 'none'}; only in the package: {sorted(theirs - ours) or 'none'}",
            hint="rebuild the package stage (run --force --until package) so both come from the same code",
        )


# -- copying a deployment out of the artifact store ----------------------------------------------
def export_directory(source: Path, destination: Path, *, main_file: str) -> Path:
    """Copy a deployment directory (one that holds `main_file`) to `destination`, replacing an earlier export.

    The engine and tokenizer links become absolute, so the copy works wherever it lives.
    """
    if not (source / main_file).is_file():
        raise StageError(f"{source} holds no {main_file}; export a deploy artifact's deploy/ directory")
    if destination.exists() and any(destination.iterdir()) and not (destination / EXPORT_MARKER).is_file():
        raise StageError(
            f"{destination} exists and was not written by trtllm-pipeline; not replacing it",
            hint="remove it, or export somewhere else",
        )
    staging = destination.with_name(f".{destination.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=True)
    for name in (layout.ENGINE_LINK, layout.TOKENIZER_LINK):
        link = staging / name
        if link.is_symlink():
            target = (source / name).resolve()
            link.unlink()
            link.symlink_to(target, target_is_directory=True)
    (staging / EXPORT_MARKER).write_text(f"exported from {source.resolve()}\n")
    trash = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    if destination.exists():
        destination.rename(trash)
    staging.rename(destination)
    shutil.rmtree(trash, ignore_errors=True)
    return destination

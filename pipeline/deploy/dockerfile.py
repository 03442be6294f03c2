"""The cpu profile's image: a Python slim image with the project and nvidia-pytriton installed.

The Dockerfile is rendered next to the compose file; its build context is the deployment
directory, where the deploy stage puts a copy of the project's source (`src/`), so the image
installs exactly the code that rendered the deployment. `.dockerignore` keeps everything else
(the model repository, the engine and tokenizer links) out of the context: those are mounted.

Inside the image, `python -m pipeline.deploy.image_setup` prepares the bundled tritonserver the
way `trtllm-pipeline serve` does (pipeline.serve.installation): a private backend directory of
symlinks to the Python backend and its stub, and the virtual environment's `bin` first on PATH.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jinja2

from pipeline.deploy.server_command import CPU_BACKEND_DIR, CPU_TRITONSERVER_ROOT
from pipeline.errors import StageError

TORCH_VERSION = "2.13.0"
VENV = "/opt/venv"
SOURCE_MOUNT = "/opt/trtllm-pipeline"
UID = 1000
GID = 1000

# What the image needs to `pip install` the project (pyproject's packages plus its metadata files).
PROJECT_FILES = ("pyproject.toml", "README.md", "constraints.txt")
PROJECT_PACKAGES = ("pipeline", "refengine", "clients", "model_repo")  # model_repo: package data (pyproject)
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*")

_TEMPLATE = """\
# Rendered by trtllm-pipeline (deploy stage) for build {{ build_name }}: the cpu target's Triton server.
# The project (src/, copied by the deploy stage) is installed with the tritonserver bundled in
# nvidia-pytriton; the reference engine runs inside Triton's Python backend. Torch is the CPU build.
# Base image: {{ base_image_note }}
FROM {{ base_image }}

ENV PIP_NO_CACHE_DIR=1 \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PYTHONDONTWRITEBYTECODE=1 \\
    PYTHONUNBUFFERED=1 \\
    VIRTUAL_ENV={{ venv }} \\
    PATH={{ venv }}/bin:$PATH

RUN python -m venv {{ venv }} \\
 && pip install --index-url {{ torch_index }} torch=={{ torch_version }}

COPY src/ {{ source }}/
RUN pip install --constraint {{ source }}/constraints.txt {{ source }} \\
 && python -m pipeline.deploy.image_setup --backend-directory {{ backend_dir }} --link {{ tritonserver_root }} \\
 && groupadd --gid {{ gid }} triton-server \\
 && useradd --uid {{ uid }} --gid {{ gid }} --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin triton-server

USER {{ uid }}:{{ gid }}
WORKDIR /tmp
EXPOSE 8000 8001 8002
"""

DOCKERIGNORE = """\
# The build context is the deployment directory; the image needs only the project's source.
*
!src
src/**/__pycache__
"""


def render_dockerfile(*, build_name: str, base_image: str, base_image_note: str, torch_index: str) -> str:
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    try:
        return environment.from_string(_TEMPLATE).render(
            build_name=build_name,
            base_image=base_image,
            base_image_note=base_image_note,
            venv=VENV,
            torch_index=torch_index,
            torch_version=TORCH_VERSION,
            source=SOURCE_MOUNT,
            backend_dir=CPU_BACKEND_DIR,
            tritonserver_root=CPU_TRITONSERVER_ROOT,
            uid=UID,
            gid=GID,
        )
    except jinja2.UndefinedError as error:
        raise StageError(f"Dockerfile template: {error.message}") from error


def project_root() -> Path:
    """The checkout this `pipeline` package runs from (the cpu image installs it)."""
    root = Path(__file__).resolve().parents[2]
    missing = [name for name in (*PROJECT_FILES, *PROJECT_PACKAGES) if not (root / name).exists()]
    if missing:
        raise StageError(
            f"{root} is not a trtllm-pipeline source checkout (missing: {', '.join(missing)}); the cpu image is built from the project's source",
            hint="run trtllm-pipeline from a source checkout (pip install -e .)",
        )
    return root


def copy_project_source(destination: Path, root: Path | None = None) -> list[Path]:
    """Copy what `pip install` needs into `destination`; the files written."""
    root = root or project_root()
    destination.mkdir(parents=True, exist_ok=False)
    for name in PROJECT_FILES:
        shutil.copyfile(root / name, destination / name)
    for package in PROJECT_PACKAGES:
        shutil.copytree(root / package, destination / package, ignore=_IGNORED)
    return sorted(path for path in destination.rglob("*") if path.is_file())

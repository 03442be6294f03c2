"""The deploy-kind interface: what the deploy stage and `trtllm-pipeline deploy` ask of a kind of deployment.

A kind (deploy.kind: compose, kubernetes) is one subpackage of pipeline/deploy/ implementing `Deployer`, entered in
pipeline.deploy.registry. What every kind shares stays beside this module: the container paths and ports
(layout), the images (images, dockerfile, image_setup), the server commands (server_command), the
monitoring configuration (monitoring) and the files every deployment directory holds (files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pipeline.config.spec import DeployKind, Spec


@dataclass(frozen=True)
class DeploymentInputs:
    """The upstream artifacts a deployment is rendered from."""

    engine_dir: Path
    tokenizer_dir: Path
    package_repository: Path | None = None  # the package stage's repository: the container's must have its files
    final_dir: Path | None = None  # where the deployment directory will finally live (links are relative to it)
    secrets: Mapping[str, str] | None = None  # the deployment's secrets; random when not given
    source_root: Path | None = None  # the project checkout an image is built from (default: this one)
    draft_engine_dir: Path | None = None  # the draft engine served as tensorrt_llm_draft (engine target, draft-target)


@dataclass(frozen=True)
class Deployment:
    """A written deployment directory, and what the deploy stage says and records about it."""

    directory: Path
    files: tuple[Path, ...]  # regular files written (links are not files)
    summary: str  # what it is, e.g. "docker compose deployment, profile cpu"
    start: str  # the command that starts it, from where it will finally live
    notes: Mapping[str, Any] = field(default_factory=dict)  # recorded in the deploy artifact's manifest


class Deployer(Protocol):
    @property
    def kind(self) -> DeployKind:  # read-only: the deployers are frozen dataclasses
        ...

    def render(self, spec: Spec, inputs: DeploymentInputs, out_dir: Path) -> Deployment:
        """Write the deployment into `out_dir` (new or empty); raises StageError/SpecError when it cannot."""
        ...

    def check(self, directory: Path) -> list[str]:
        """Problems of a written deployment as its tools would read it (empty when it is fine)."""
        ...

    def export(self, source: Path, destination: Path) -> Path:
        """Copy a deployment out of the artifact store (e.g. to ./deploy), replacing an earlier export."""
        ...

    def start_command(self, spec: Spec, directory: Path) -> str:
        """The command that starts the deployment in `directory`, from any working directory."""
        ...

    def up(self, spec: Spec, directory: Path, *, services: Sequence[str] = (), extra_files: Sequence[Path] = ()) -> str:
        """Start the deployment in `directory` (only `services`, if given; `extra_files`: the kind's override
        files, applied after its own); the tool's output."""
        ...

"""deploy.kind kubernetes: the Deployer (pipeline.deploy.base) of the manifests and kustomizations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.spec import DeployKind, Spec
from pipeline.deploy import files
from pipeline.deploy.base import Deployment, DeploymentInputs
from pipeline.deploy.kubernetes import kustomize, names
from pipeline.deploy.kubernetes.checks import lint_directory
from pipeline.deploy.kubernetes.writer import write_deployment
from pipeline.errors import SpecError, StageError, ToolError
from pipeline.tools import run_command

APPLY_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class KubernetesDeployer:
    kind: DeployKind = DeployKind.kubernetes

    def render(self, spec: Spec, inputs: DeploymentInputs, out_dir: Path) -> Deployment:
        written = write_deployment(spec, out_dir, inputs)
        final = inputs.final_dir or out_dir
        return Deployment(
            directory=out_dir,
            files=written.files,
            summary=f"kubernetes deployment ({written.workload}, overlay {written.overlay.rsplit('/', 1)[1]})",
            start=f"kubectl apply -k {final}/{written.overlay}",
            notes={"overlay": written.overlay, "workload": written.workload},
        )

    def check(self, directory: Path) -> list[str]:
        return lint_directory(directory)

    def export(self, source: Path, destination: Path) -> Path:
        return files.export_directory(source, destination, main_file=f"{names.BASE_DIR}/{names.KUSTOMIZATION}")

    def start_command(self, spec: Spec, directory: Path) -> str:
        return f"kubectl apply -k {directory}/{kustomize.default_overlay(spec)}"

    def up(self, spec: Spec, directory: Path, *, services: Sequence[str] = (), extra_files: Sequence[Path] = ()) -> str:
        if services or extra_files:
            raise SpecError("--service and --file are docker compose options; deploy.kind is kubernetes", hint="use a kustomize overlay of your own")
        overlay = directory / kustomize.default_overlay(spec)
        if not (overlay / names.KUSTOMIZATION).is_file():
            raise StageError(f"{overlay} holds no {names.KUSTOMIZATION}; run the deploy stage first")
        try:
            return run_command(["kubectl", "apply", "-k", str(overlay)], timeout=APPLY_TIMEOUT_SECONDS)
        except ToolError as error:
            hint = (
                "--up needs kubectl with a reachable cluster, the model on the claim (docs/kubernetes.md: Applying them), "
                "and the CRDs of the overlay (prometheus-operator; LeaderWorkerSet when the model spans nodes)"
            )
            raise ToolError(error.command, error.returncode, error.stderr_tail, hint=hint) from None

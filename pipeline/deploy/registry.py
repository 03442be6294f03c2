"""One deployer per deploy.kind: the deploy stage and `trtllm-pipeline deploy` choose here, never by name."""

from __future__ import annotations

from pipeline.config.spec import DeployKind
from pipeline.deploy.base import Deployer
from pipeline.deploy.compose.deployer import ComposeDeployer
from pipeline.deploy.kubernetes.deployer import KubernetesDeployer
from pipeline.errors import SpecError

DEPLOYERS: dict[DeployKind, type[Deployer]] = {
    DeployKind.compose: ComposeDeployer,
    DeployKind.kubernetes: KubernetesDeployer,
}


def deployer_for(kind: DeployKind) -> Deployer:
    deployer = DEPLOYERS.get(kind)
    if deployer is None:
        raise SpecError(f"deploy.kind {kind.value!r} has no deployer; known: {', '.join(k.value for k in DEPLOYERS)}")
    return deployer()

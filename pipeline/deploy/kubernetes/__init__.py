"""deploy.kind kubernetes: plain manifests with a kustomize base and overlays (no Helm chart: nothing could test one here).

    KubernetesDeployer()                      the kind's Deployer (pipeline.deploy.base)
    rendered_files(spec)                      every manifest and kustomization, as text by path
    write_deployment(spec, out_dir, …)        the whole deployment directory (layout: pipeline.deploy.kubernetes.names)

Triton runs as a Deployment when its ranks fit deploy.gpus_per_node, as a LeaderWorkerSet across nodes otherwise
(pipeline.deploy.kubernetes.workloads); the OpenAI front end as its own Deployment; Services, disruption budgets,
a PodMonitor, a PrometheusRule (the rules every kind renders) and, with deploy.kubernetes.autoscaling, a
HorizontalPodAutoscaler on NVIDIA's queue-to-compute ratio with the prometheus-adapter rule that defines it.
"""

from pipeline.deploy.kubernetes.deployer import KubernetesDeployer
from pipeline.deploy.kubernetes.writer import KubernetesDeployment, rendered_files, write_deployment

__all__ = ["KubernetesDeployer", "KubernetesDeployment", "rendered_files", "write_deployment"]

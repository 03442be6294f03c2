"""The other resources of the kubernetes kind: namespace, claim, scripts, the leader's RBAC, Services, the disruption
budget, and for the overlays the PodMonitor, PrometheusRule (pipeline.deploy.rules), HorizontalPodAutoscaler and the
prometheus-adapter rule that turns NVIDIA's queue-to-compute ratio into the per-pod metric the autoscaler reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.backends.engine import runtime as engine_runtime
from pipeline.config.spec import Spec
from pipeline.deploy import layout, rules
from pipeline.deploy.kubernetes import llmapi_forms, names, verify_artifacts, workloads
from pipeline.deploy.monitoring import SCRAPE_INTERVAL
from pipeline.deploy.server_command import LLM_MODEL

AUTOSCALING_METRIC = "trtllm_pipeline_queue_to_compute_ratio"

LEADER_SCRIPT = """\
#!/bin/sh
# Rendered by trtllm-pipeline: the LeaderWorkerSet leader's launch. Waits for the group's workers, then runs
# leader mode's mpirun (the arguments: one `-n 1 tritonserver ...` block per rank) with one slot per GPU of every pod.
set -eu
hosts="$POD_NAME:$GPUS_PER_NODE"
worker=1
while [ "$worker" -lt "$LWS_GROUP_SIZE" ]; do
  hosts="$hosts,$POD_NAME-$worker:$GPUS_PER_NODE"
  worker=$((worker + 1))
done
echo "waiting for the workers of $POD_NAME ($hosts)"
kubectl wait --for=condition=Ready pod --timeout=30m \\
  --selector "{group_key}=$GROUP_KEY,{worker_index}!=0"
exec mpirun --allow-run-as-root --mca plm_rsh_agent {kubessh} --host "$hosts" "$@"
"""

KUBESSH = """\
#!/bin/sh
# mpirun's rsh agent: `kubessh POD COMMAND...` runs COMMAND in the triton container of POD.
pod="$1"
shift
exec kubectl exec "$pod" --container {container} -- /bin/sh -c "$*"
"""


def _meta(spec: Spec, name: str, component: str = names.TRITON) -> dict[str, Any]:
    return {"name": name, "labels": names.labels(spec, component)}


def namespace(spec: Spec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.deploy.kubernetes_settings.namespace}}


def claim(spec: Spec) -> dict[str, Any]:
    storage = spec.deploy.kubernetes_settings.storage
    body: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": storage.size}}}
    if storage.storage_class is not None:
        body["storageClassName"] = storage.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(spec, storage.claim_name), "spec": body}


def scripts(spec: Spec) -> dict[str, Any]:
    data = {names.VERIFY_SCRIPT: Path(verify_artifacts.__file__).read_text(encoding="utf-8")}
    if layout.container_facts(spec.build.target.value).checks_engine_in_container:
        data[names.ENGINE_CHECK_SCRIPT] = Path(engine_runtime.__file__).read_text(encoding="utf-8")
    if workloads.spans_nodes(spec):
        kubessh = f"{names.SCRIPTS_MOUNT}/{names.KUBESSH_SCRIPT}"
        data[names.LEADER_SCRIPT] = (
            LEADER_SCRIPT.replace("{group_key}", names.LWS_GROUP_KEY_LABEL)
            .replace("{worker_index}", names.LWS_WORKER_INDEX_LABEL)
            .replace("{kubessh}", kubessh)
        )
        data[names.KUBESSH_SCRIPT] = KUBESSH.replace("{container}", names.TRITON)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, names.object_name(spec, "scripts")), "data": data}


def leader_access(spec: Spec) -> list[dict[str, Any]]:
    """The leader's service account: it watches and execs into the pods of its group (nothing else)."""
    name = names.object_name(spec, "leader")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, name), "automountServiceAccountToken": False},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(spec, name),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(spec, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.deploy.kubernetes_settings.namespace}],
        },
    ]


def _triton_selector(spec: Spec) -> dict[str, str]:
    leaders = {"role": "leader"} if workloads.spans_nodes(spec) else {}
    return {**names.selector(spec, names.TRITON), **leaders}


def services(spec: Spec) -> list[dict[str, Any]]:
    deploy = spec.deploy
    triton_ports = [
        {"name": "http", "port": deploy.http_port, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": deploy.grpc_port, "targetPort": "grpc", "protocol": "TCP"},
        {"name": "metrics", "port": deploy.metrics_port, "targetPort": "metrics", "protocol": "TCP"},
    ]
    openai_ports = [{"name": "http", "port": deploy.openai_port, "targetPort": "http", "protocol": "TCP"}]
    ports = {names.TRITON: triton_ports, names.OPENAI: openai_ports}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(spec, names.object_name(spec, component), component),
            "spec": {
                "type": "ClusterIP",
                "selector": _triton_selector(spec) if component == names.TRITON else names.selector(spec, component),
                "ports": ports[component] if component in ports else llmapi_forms.service_ports(spec, component),
            },
        }
        for component in llmapi_forms.front_components(spec)
    ]


def disruption_budgets(spec: Spec) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(spec, names.object_name(spec, component), component),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(spec, component)}},
        }
        for component in llmapi_forms.front_components(spec)
    ]


def pod_monitor(spec: Spec) -> dict[str, Any]:
    """Scrapes rank 0 of every replica; `job` is the pod's component label (triton) and `build` its instance label,
    the labels the rules select on."""
    return _pod_monitor(spec, names.TRITON, _triton_selector(spec), "metrics")


def openai_pod_monitor(spec: Spec) -> dict[str, Any]:
    """Scrapes the OpenAI front end's /metrics (TTFT and inter-token histograms): job `openai`, the rules' source of TTFT / ITL."""
    return _pod_monitor(spec, names.OPENAI, names.selector(spec, names.OPENAI), "http")


def _pod_monitor(spec: Spec, component: str, selector: dict[str, str], port: str) -> dict[str, Any]:
    label = "__meta_kubernetes_pod_label_" + names.INSTANCE_LABEL.replace(".", "_").replace("/", "_").replace("-", "_")
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(spec, names.object_name(spec, component), component),
        "spec": {
            "jobLabel": names.COMPONENT_LABEL,
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "relabelings": [{"sourceLabels": [label], "targetLabel": rules.BUILD_LABEL, "action": "replace"}],
                }
            ],
        },
    }


def prometheus_rule(spec: Spec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(spec, names.object_name(spec, "rules")),
        "spec": {"groups": rules.rule_groups(spec)},
    }


def _quantity(value: float) -> str:
    return f"{round(value * 1000)}m"


def autoscaler(spec: Spec) -> dict[str, Any]:
    scaling = spec.deploy.kubernetes_settings.autoscaling
    if scaling is None:
        raise ValueError("autoscaler() needs deploy.kubernetes.autoscaling")
    workload = workloads.triton_workload(spec)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(spec, names.object_name(spec, names.TRITON)),
        "spec": {
            "scaleTargetRef": {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": workload["metadata"]["name"]},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": AUTOSCALING_METRIC},
                        "target": {"type": "AverageValue", "averageValue": _quantity(scaling.queue_to_compute_target)},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                "scaleDown": {"stabilizationWindowSeconds": 600, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def adapter_rules() -> dict[str, Any]:
    """prometheus-adapter's configuration (its `rules:`) defining the per-pod ratio the autoscaler targets."""
    selector = f'{{model="{LLM_MODEL}",<<.LabelMatchers>>}}'
    return {
        "rules": [
            {
                "seriesQuery": f'nv_inference_queue_duration_us{{namespace!="",pod!="",model="{LLM_MODEL}"}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": "^nv_inference_queue_duration_us$", "as": AUTOSCALING_METRIC},
                "metricsQuery": rules.queue_to_compute_ratio(selector=selector, by="sum by (<<.GroupBy>>)"),
            }
        ]
    }


def adapter_config_map(spec: Spec) -> dict[str, Any]:
    text = yaml.safe_dump(adapter_rules(), sort_keys=False, width=4096)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(spec, names.object_name(spec, "adapter-rules")), "data": {"config.yaml": text}}

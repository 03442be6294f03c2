"""Names every manifest of the kubernetes kind shares: directory layout, object names, labels, what the claim holds.

A kubernetes deployment directory holds, beside what every kind writes (pipeline.deploy.layout):

    kubernetes/base/                    kustomization.yaml, namespace.yaml, triton.yaml (Deployment, or LeaderWorkerSet
                                        with its leader's ServiceAccount and Role), openai.yaml, services.yaml,
                                        disruption.yaml, scripts.yaml (ConfigMap), storage.yaml (the claim, unless it
                                        exists), secret.env (mode 0600: the admin key, through a secretGenerator)
    kubernetes/overlays/monitoring/     the base + PodMonitor and PrometheusRule (prometheus-operator CRDs)
    kubernetes/overlays/autoscaling/    monitoring + HorizontalPodAutoscaler and the prometheus-adapter rule
                                        (only with deploy.kubernetes.autoscaling)

The PersistentVolumeClaim holds the model as the pods read it (copied there by the operator, docs/kubernetes.md):

    model_repository/    this directory's model_repository/ (mounted at /models)
    build/               the build artifact as stored: manifest.json and engine/ (mounted at /engine)
    prepare/             the prepare artifact: manifest.json and the tokenizer (mounted at /tokenizer)
"""

from __future__ import annotations

import re

from pipeline.config.spec import Spec

KUBERNETES_DIR = "kubernetes"
BASE_DIR = f"{KUBERNETES_DIR}/base"
MONITORING_OVERLAY = f"{KUBERNETES_DIR}/overlays/monitoring"
AUTOSCALING_OVERLAY = f"{KUBERNETES_DIR}/overlays/autoscaling"
KUSTOMIZATION = "kustomization.yaml"
SECRET_ENV = "secret.env"

STORE_REPOSITORY = "model_repository"
STORE_BUILD = "build"
STORE_ENGINE = "build/engine"
STORE_TOKENIZER = "prepare"
STORE_MOUNT = "/store"  # the whole claim, in the verifying init container
SCRIPTS_MOUNT = "/opt/trtllm-pipeline-scripts"  # not /opt/trtllm-pipeline: the cpu image keeps its source there
VERIFY_SCRIPT = "verify_artifacts.py"
ENGINE_CHECK_SCRIPT = "engine_runtime.py"
LEADER_SCRIPT = "launch_leader.sh"
KUBESSH_SCRIPT = "kubessh"

TRITON = "triton"
OPENAI = "openai"
PART_OF = "trtllm-pipeline"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
_MAX_BASE = 30  # LeaderWorkerSet pods are <name>-<group>-<worker>; every name stays a DNS-1035 label


def base_name(spec: Spec) -> str:
    """spec.name as a DNS-1035 label (Service names): lowercase, `-` for anything else, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", spec.name.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"m-{name}"
    return name[:_MAX_BASE].rstrip("-")


def object_name(spec: Spec, component: str) -> str:
    return f"{base_name(spec)}-{component}"


def labels(spec: Spec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": PART_OF, INSTANCE_LABEL: base_name(spec), COMPONENT_LABEL: component}


def selector(spec: Spec, component: str) -> dict[str, str]:
    return {INSTANCE_LABEL: base_name(spec), COMPONENT_LABEL: component}


def quantity(docker_size: str) -> str:
    """A docker size (2g, 512m, 1024k, bytes) as a Kubernetes quantity (2Gi, …): both mean powers of 1024."""
    unit = docker_size[-1:].lower()
    suffix = {"k": "Ki", "m": "Mi", "g": "Gi"}.get(unit)
    return f"{docker_size[:-1]}{suffix}" if suffix else docker_size

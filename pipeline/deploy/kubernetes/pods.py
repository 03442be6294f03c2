"""Pod pieces of the kubernetes kind: the hardening (as compose applies it, pipeline/deploy/compose/document.py), probes on
Triton's /v2/health endpoints, the volumes (model claim, shm, /tmp, scripts) and the init container that verifies the
artifacts on the claim against their manifests."""

from __future__ import annotations

from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.kubernetes import names

USER_ID = 1000  # the NGC image's triton-server; the cpu image creates the same uid
PROBE_PERIOD_SECONDS = 10
TMP_SIZE = "1Gi"
ADMIN_KEY_REFERENCE = f"$({layout.ADMIN_KEY_VARIABLE})"  # expanded by the kubelet from the container's env
RUNTIME_ENVIRONMENT = {  # nothing may reach for the network or write outside /tmp
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HOME": "/tmp/huggingface",
    "XDG_CACHE_HOME": "/tmp/cache",
}
MODELS_VOLUME, SHM_VOLUME, TMP_VOLUME, SCRIPTS_VOLUME = "models", "dshm", "tmp", "scripts"
API_KEYS_VOLUME = "api-keys"


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "fsGroup": USER_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def environment(extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [{"name": key, "value": value} for key, value in {**RUNTIME_ENVIRONMENT, **(extra or {})}.items()]


def admin_key_env(spec: Spec) -> dict[str, Any]:
    secret = {"name": names.object_name(spec, "secrets"), "key": layout.ADMIN_KEY_VARIABLE}
    return {"name": layout.ADMIN_KEY_VARIABLE, "valueFrom": {"secretKeyRef": secret}}


def api_keys_volume(spec: Spec) -> dict[str, Any]:
    """The Secret's API-keys entry as one file (mode 0440, group: the pod's fsGroup, which the front end runs as). Mounted without
    subPath, so the kubelet refreshes it when the Secret changes; the front end reads it at start (rotation: a restart)."""
    item = {"key": layout.OPENAI_API_KEYS_VARIABLE, "path": layout.API_KEYS_FILE}
    secret = {"secretName": names.object_name(spec, "secrets"), "items": [item], "defaultMode": 0o440}
    return {"name": API_KEYS_VOLUME, "secret": secret}


def api_keys_mount() -> dict[str, Any]:
    return {"name": API_KEYS_VOLUME, "mountPath": layout.API_KEYS_MOUNT, "readOnly": True}


def volumes(spec: Spec, *, shm: bool = True) -> list[dict[str, Any]]:
    storage = spec.deploy.kubernetes_settings.storage
    found: list[dict[str, Any]] = [
        {"name": MODELS_VOLUME, "persistentVolumeClaim": {"claimName": storage.claim_name, "readOnly": True}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": TMP_SIZE}},
        {"name": SCRIPTS_VOLUME, "configMap": {"name": names.object_name(spec, "scripts"), "defaultMode": 0o555}},
    ]
    if shm:
        found.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": names.quantity(spec.deploy.shm_size)}})
    return found


def model_mounts(*, shm: bool = True) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": MODELS_VOLUME, "mountPath": layout.MODELS_MOUNT, "subPath": names.STORE_REPOSITORY, "readOnly": True},
        {"name": MODELS_VOLUME, "mountPath": layout.ENGINE_MOUNT, "subPath": names.STORE_ENGINE, "readOnly": True},
        {"name": MODELS_VOLUME, "mountPath": layout.TOKENIZER_MOUNT, "subPath": names.STORE_TOKENIZER, "readOnly": True},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": SCRIPTS_VOLUME, "mountPath": names.SCRIPTS_MOUNT, "readOnly": True},
    ]
    if shm:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    return mounts


def verify_init_container(image: str) -> dict[str, Any]:
    """Checks build/ and prepare/ on the claim against their artifact manifests; the pod does not start otherwise."""
    return {
        "name": "verify-artifacts",
        "image": image,
        "command": [
            "python3",
            f"{names.SCRIPTS_MOUNT}/{names.VERIFY_SCRIPT}",
            f"{names.STORE_MOUNT}/{names.STORE_BUILD}",
            f"{names.STORE_MOUNT}/{names.STORE_TOKENIZER}",
        ],
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": MODELS_VOLUME, "mountPath": names.STORE_MOUNT, "readOnly": True},
            {"name": SCRIPTS_VOLUME, "mountPath": names.SCRIPTS_MOUNT, "readOnly": True},
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
        ],
    }


def triton_ports() -> list[dict[str, Any]]:
    return [
        {"name": "http", "containerPort": layout.CONTAINER_HTTP_PORT, "protocol": "TCP"},
        {"name": "grpc", "containerPort": layout.CONTAINER_GRPC_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": layout.CONTAINER_METRICS_PORT, "protocol": "TCP"},
    ]


def health_probes(start_period: str, *, ready: str = "/v2/health/ready", live: str = "/v2/health/live") -> dict[str, Any]:
    """Startup waits out the model load (the target's start period), then readiness and liveness take over; the
    paths are Triton's unless given."""
    seconds = int(start_period.rstrip("s"))

    def probe(path: str, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": "http"},
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": probe(ready, max(1, seconds // PROBE_PERIOD_SECONDS)),
        "readinessProbe": probe(ready, 3),
        "livenessProbe": probe(live, 3),
    }


def pod_spec(spec: Spec, containers: list[dict[str, Any]], *, image: str, grace_seconds: int, shm: bool = True) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": grace_seconds,
    }
    if spec.deploy.kubernetes_settings.storage.verify:
        pod["initContainers"] = [verify_init_container(image)]
    pod["containers"] = containers
    pod["volumes"] = volumes(spec, shm=shm)
    return pod

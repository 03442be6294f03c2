"""The workloads of the kubernetes kind: Triton as a Deployment (its ranks fit one node: nvidia.com/gpu = tp×pp), or as
a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) whose group spans nodes, and the OpenAI front end as a Deployment.

Multi-node, as the TensorRT-LLM example of LeaderWorkerSet (kubernetes-sigs/lws docs/examples/tensorrt-llm) and
NVIDIA's multi-node Triton tutorial run it: one pod per node holding all its GPUs; the leader waits for its
workers, then runs the single `mpirun` of leader mode (pipeline.deploy.server_command) with one slot per GPU of
every pod, starting the remote ranks through `kubectl exec` (the `kubessh` rsh agent), so its image needs
`kubectl` and the leader a service account allowed to exec into its group's pods. Rank 0 (on the leader) serves
HTTP, gRPC and metrics; the workers only idle until mpirun reaches them.
"""

from __future__ import annotations

from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy import images, layout
from pipeline.deploy.kubernetes import names, pods
from pipeline.deploy.server_command import STOP_GRACE_SECS, cpu_server_command, engine_entrypoint, engine_server_command, openai_command

WORKER_IDLE = 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done'


def triton_image(spec: Spec) -> str:
    target = spec.build.target.value
    if layout.container_facts(target).image_has_project:
        return images.cpu_image_tag(spec.name)  # built from the Dockerfile beside; kustomize `images:` renames it
    return images.server_image(spec, target).reference


def openai_image(spec: Spec) -> str:
    """The OpenAI front end needs the project installed: the image built from the rendered Dockerfile."""
    return images.cpu_image_tag(spec.name)


def ranks(spec: Spec) -> int:
    return spec.build.tp_size * spec.build.pp_size


def spans_nodes(spec: Spec) -> bool:
    facts = layout.container_facts(spec.build.target.value)
    return facts.reserves_gpus and ranks(spec) > spec.deploy.gpus_per_node


def _replicas(spec: Spec) -> int:
    settings = spec.deploy.kubernetes_settings
    return settings.autoscaling.min_replicas if settings.autoscaling else settings.replicas


def _gpu_resources(count: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": str(count)}} if count else {}


def _triton_container(spec: Spec, command: list[str], args: list[str], gpus: int, *, serves: bool) -> dict[str, Any]:
    extra = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"} if ranks(spec) > 1 else {}
    container: dict[str, Any] = {"name": names.TRITON, "image": triton_image(spec), "imagePullPolicy": "IfNotPresent"}
    if command:
        container["command"] = command
    container["args"] = args
    container["env"] = [*pods.environment(extra), pods.admin_key_env(spec)]
    if serves:
        container["ports"] = pods.triton_ports()
        container.update(pods.health_probes(layout.container_facts(spec.build.target.value).health_start_period))
    if gpus:
        container["resources"] = _gpu_resources(gpus)
    container["securityContext"] = pods.container_security()
    container["volumeMounts"] = pods.model_mounts()
    if layout.container_facts(spec.build.target.value).checks_engine_in_container:
        check = {"name": pods.SCRIPTS_VOLUME, "mountPath": layout.ENGINE_CHECK_MOUNT, "subPath": names.ENGINE_CHECK_SCRIPT, "readOnly": True}
        container["volumeMounts"].append(check)
    return container


def _entrypoint(spec: Spec) -> list[str]:
    if layout.container_facts(spec.build.target.value).checks_engine_in_container:
        return engine_entrypoint(images.engine_for_image(spec, triton_image(spec)))
    return []


def _template(spec: Spec, containers: list[dict[str, Any]], extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": {**names.labels(spec, names.TRITON), **(extra_labels or {})}},
        "spec": pods.pod_spec(spec, containers, image=triton_image(spec), grace_seconds=STOP_GRACE_SECS),
    }


def _head(spec: Spec, api_version: str, kind: str, component: str = names.TRITON) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": names.object_name(spec, component), "labels": names.labels(spec, component)},
    }


def triton_deployment(spec: Spec) -> dict[str, Any]:
    target = spec.build.target.value
    facts = layout.container_facts(target)
    if facts.image_has_project:
        command, args = [], cpu_server_command(pods.ADMIN_KEY_REFERENCE)
    else:
        # one server process when the runtime starts its own ranks (the LLM API spawns its MPI workers)
        world_size = ranks(spec) if facts.mpi_leader_ranks else 1
        command, args = _entrypoint(spec), engine_server_command(world_size, pods.ADMIN_KEY_REFERENCE)
    gpus = ranks(spec) * spec.serve.instances.tensorrt_llm if facts.reserves_gpus else 0
    container = _triton_container(spec, command, args, gpus, serves=True)
    return {
        **_head(spec, "apps/v1", "Deployment"),
        "spec": {
            "replicas": _replicas(spec),
            "selector": {"matchLabels": names.selector(spec, names.TRITON)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": _template(spec, [container]),
        },
    }


def leader_worker_set(spec: Spec) -> dict[str, Any]:
    per_node = spec.deploy.gpus_per_node
    blocks = engine_server_command(ranks(spec), pods.ADMIN_KEY_REFERENCE)[2:]  # after `mpirun --allow-run-as-root`
    leader_command = [*_entrypoint(spec), "/bin/sh", f"{names.SCRIPTS_MOUNT}/{names.LEADER_SCRIPT}"]
    leader = _triton_container(spec, leader_command, blocks, per_node, serves=True)
    leader["env"] += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "GROUP_KEY", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{names.LWS_GROUP_KEY_LABEL}']"}}},
        {"name": "GPUS_PER_NODE", "value": str(per_node)},
    ]
    worker = _triton_container(spec, [*_entrypoint(spec), "/bin/sh", "-c", WORKER_IDLE], [], per_node, serves=False)
    leader_template = _template(spec, [leader], {"role": "leader"})
    leader_template["spec"]["serviceAccountName"] = names.object_name(spec, "leader")
    leader_template["spec"]["automountServiceAccountToken"] = True  # kubectl exec into its group (kubessh)
    worker_template = _template(spec, [worker], {"role": "worker"})
    return {
        **_head(spec, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        "spec": {
            "replicas": _replicas(spec),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": ranks(spec) // per_node,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_template,
                "workerTemplate": worker_template,
            },
        },
    }


def openai_deployment(spec: Spec) -> dict[str, Any]:
    """The front end asks for the API keys of the Secret, mounted as a file. It is ready when its /health is (open without
    a key: Triton ready); started and alive while it accepts connections, so that a Triton still loading a large engine,
    or restarting, does not restart it too."""
    image = openai_image(spec)
    timing = {"periodSeconds": pods.PROBE_PERIOD_SECONDS, "timeoutSeconds": 5}
    listening = {"tcpSocket": {"port": "http"}, **timing}
    command = openai_command(
        spec,
        triton_url=f"{names.object_name(spec, names.TRITON)}:{spec.deploy.grpc_port}",
        api_key_file=f"{layout.API_KEYS_MOUNT}/{layout.API_KEYS_FILE}",
    )
    container = {
        "name": names.OPENAI,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command[:1],
        "args": command[1:],
        "env": pods.environment(),
        "ports": [{"name": "http", "containerPort": layout.OPENAI_PORT, "protocol": "TCP"}],
        "startupProbe": {**listening, "failureThreshold": 30},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, **timing, "failureThreshold": 3},
        "livenessProbe": {**listening, "failureThreshold": 3},
        "securityContext": pods.container_security(),
        "volumeMounts": [*(mount for mount in pods.model_mounts(shm=False) if mount["mountPath"] != layout.ENGINE_MOUNT), pods.api_keys_mount()],
    }
    pod = pods.pod_spec(spec, [container], image=image, grace_seconds=30, shm=False)
    pod["volumes"].append(pods.api_keys_volume(spec))
    return {
        **_head(spec, "apps/v1", "Deployment", names.OPENAI),
        "spec": {
            "replicas": spec.deploy.kubernetes_settings.openai_replicas,
            "selector": {"matchLabels": names.selector(spec, names.OPENAI)},
            "template": {
                "metadata": {"labels": names.labels(spec, names.OPENAI)},
                "spec": pod,
            },
        },
    }


def triton_workload(spec: Spec) -> dict[str, Any]:
    return leader_worker_set(spec) if spans_nodes(spec) else triton_deployment(spec)

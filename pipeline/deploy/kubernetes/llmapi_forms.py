"""The kubernetes kind for a target in NVIDIA's llmapi layout (build.target llmapi): which of its two forms the
manifests run (deploy.kubernetes.llmapi_form), and the trtllm-serve form's resources.

- `triton` (the default): the engine target's structure — Triton Deployment, Service, disruption budget, PodMonitor,
  PrometheusRule, HorizontalPodAutoscaler — with the `llmapi` model repository in NVIDIA's Triton TRT-LLM image. One
  tritonserver per pod: LLM() starts its own tp × pp ranks (no leader-mode mpirun). No OpenAI front end: the
  project's front end speaks the ensemble's tensors (text_input, max_tokens, ...), not the llmapi model's
  (text_input, sampling_param_*); trtllm-serve is this target's OpenAI endpoint.
- `trtllm-serve`: NVIDIA's OpenAI-compatible server in its TensorRT-LLM release image — a Deployment running
  `trtllm-serve /engine ... --extra_llm_api_options /trtllm_serve/extra-llm-api-config.yml` (the same LLM() options
  as model.yaml, from a ConfigMap), probed on /health (tensorrt_llm/serve/openai_server.py registers /health,
  /health_generate, /version, /v1/models, /metrics, /v1/completions, /v1/chat/completions), its Service and
  disruption budget. No monitoring overlay: trtllm-serve's /metrics answers JSON iteration statistics, not the
  Prometheus text format; its Prometheus endpoint (/prometheus/metrics) exists only with the prototype LLM() option
  return_perf_metrics, which this version does not render, and the rules and the autoscaler read Triton's series.

Multi-node (tp × pp > deploy.gpus_per_node) is refused at validate for this target (TargetTraits.no_multinode_because).
"""

from __future__ import annotations

from typing import Any

from pipeline.backends.base import LlmApiRepository
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.kubernetes import names, pods

TRTLLM_SERVE = "trtllm-serve"  # the form, and the component label / object-name suffix of its resources
HEALTH_PATH = "/health"  # 200 when the LLM is healthy, 503 otherwise (OpenAIServer.health)
OPTIONS_VOLUME = "trtllm-serve-options"


def llm_api_of(spec: Spec) -> LlmApiRepository | None:
    return backend_for(spec.build.target).llm_api


def runs_trtllm_serve(spec: Spec) -> bool:
    return llm_api_of(spec) is not None and spec.deploy.kubernetes_settings.llmapi_form == TRTLLM_SERVE


def front_components(spec: Spec) -> tuple[str, ...]:
    """The components with a Service and a disruption budget: Triton and the project's OpenAI front end, Triton alone
    (the llmapi model, whose contract the front end does not speak), or trtllm-serve alone."""
    if llm_api_of(spec) is None:
        return (names.TRITON, names.OPENAI)
    return (TRTLLM_SERVE,) if runs_trtllm_serve(spec) else (names.TRITON,)


def service_ports(spec: Spec, component: str) -> list[dict[str, Any]]:
    """trtllm-serve's port: deploy.openai_port (its OpenAI endpoint), to its container's http port."""
    if component != TRTLLM_SERVE:
        raise ValueError(f"service_ports() is for {TRTLLM_SERVE}, not {component}")
    return [{"name": "http", "port": spec.deploy.openai_port, "targetPort": "http", "protocol": "TCP"}]


def options_config_map(spec: Spec, options_text: str) -> dict[str, Any]:
    """The --extra_llm_api_options YAML, as the package stage rendered it (the same LLM() options as model.yaml)."""
    llm_api = _llm_api(spec)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.object_name(spec, TRTLLM_SERVE), "labels": names.labels(spec, TRTLLM_SERVE)},
        "data": {llm_api.openai_options_file: options_text},
    }


def _llm_api(spec: Spec) -> LlmApiRepository:
    llm_api = llm_api_of(spec)
    if llm_api is None:
        raise ValueError(f"build.target {spec.build.target.value} has no trtllm-serve form")
    return llm_api


def trtllm_serve_deployment(spec: Spec) -> dict[str, Any]:
    llm_api = _llm_api(spec)
    image = llm_api.openai_image(spec)
    argv = llm_api.openai_command(layout.ENGINE_MOUNT, f"{layout.OPENAI_FORM_MOUNT}/{llm_api.openai_options_file}")
    facts = layout.container_facts(spec.build.target.value)
    engine = next(mount for mount in pods.model_mounts() if mount["mountPath"] == layout.ENGINE_MOUNT)
    mounts = [
        engine,
        {"name": OPTIONS_VOLUME, "mountPath": layout.OPENAI_FORM_MOUNT, "readOnly": True},
        {"name": pods.TMP_VOLUME, "mountPath": "/tmp"},
        {"name": pods.SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    container = {
        "name": TRTLLM_SERVE,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "env": pods.environment({"HOME": "/tmp"}),
        "ports": [{"name": "http", "containerPort": llm_api.openai_port, "protocol": "TCP"}],
        **pods.health_probes(facts.health_start_period, ready=HEALTH_PATH, live=HEALTH_PATH),
        "resources": {"limits": {"nvidia.com/gpu": str(spec.build.tp_size * spec.build.pp_size)}},
        "securityContext": pods.container_security(),
        "volumeMounts": mounts,
    }
    pod = pods.pod_spec(spec, [container], image=image, grace_seconds=30)
    pod["volumes"].append({"name": OPTIONS_VOLUME, "configMap": {"name": names.object_name(spec, TRTLLM_SERVE)}})
    settings = spec.deploy.kubernetes_settings
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.object_name(spec, TRTLLM_SERVE), "labels": names.labels(spec, TRTLLM_SERVE)},
        "spec": {
            "replicas": settings.replicas,
            "selector": {"matchLabels": names.selector(spec, TRTLLM_SERVE)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": names.labels(spec, TRTLLM_SERVE)}, "spec": pod},
        },
    }

"""Names every kind of deployment shares: the directory layout, container paths, ports, services and secrets.

A deployment directory (the deploy artifact's `deploy/`, or `./deploy/` in a checkout) holds its kind's
own files (pipeline.deploy.compose.layout: docker-compose.yml and .env) and:

    model_repository/         the Triton repository rendered for the container (/engine, /tokenizer)
    engine -> …/build-<digest>/engine          symlinks to the upstream artifacts (nothing copied)
    tokenizer -> …/prepare-<digest>
    prometheus/prometheus.yml                  (rule_files: the rules below, mounted at /etc/prometheus/rules.yml)
    prometheus/rules.yml, rules.test.yml       recording and alerting rules, their promtool test (pipeline.deploy.rules)
    grafana/provisioning/datasources/prometheus.yml
    grafana/provisioning/dashboards/trtllm-pipeline.yml
    grafana/dashboards/trtllm-pipeline.json
    Dockerfile, .dockerignore, src/            cpu target only: the image with the project installed
    engine_runtime.py         engine target only: the container's entrypoint check (engine vs runtime)
    trtllm_serve/             llmapi target only: trtllm-serve's --extra_llm_api_options file (and its argv)
"""

from __future__ import annotations

from clients.api_keys import API_KEYS_VARIABLE
from pipeline.backends.base import ComposeFacts
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Target
from pipeline.errors import SpecError

DOCKERFILE = "Dockerfile"
DOCKERIGNORE = ".dockerignore"
SOURCE_DIR = "src"
MODEL_REPOSITORY_DIR = "model_repository"
ENGINE_LINK = "engine"
DRAFT_ENGINE_LINK = "draft_engine"  # the draft stage's engine of draft-target speculative decoding (engine target)
TOKENIZER_LINK = "tokenizer"
PROMETHEUS_CONFIG = "prometheus/prometheus.yml"
GRAFANA_DATASOURCES = "grafana/provisioning/datasources/prometheus.yml"
GRAFANA_DASHBOARD_PROVIDERS = "grafana/provisioning/dashboards/trtllm-pipeline.yml"
GRAFANA_DASHBOARDS_DIR = "grafana/dashboards"
GRAFANA_DASHBOARD = f"{GRAFANA_DASHBOARDS_DIR}/trtllm-pipeline.json"
GRAFANA_PROVISIONING_DIR = "grafana/provisioning"
ENGINE_CHECK_FILE = "engine_runtime.py"  # a copy of pipeline/backends/engine/runtime.py
OPENAI_FORM_DIR = "trtllm_serve"  # a target in NVIDIA's llmapi layout: trtllm-serve's options, as its container sees them

# Inside the containers.
MODELS_MOUNT = "/models"
ENGINE_MOUNT = "/engine"
DRAFT_ENGINE_MOUNT = "/draft_engine"
TOKENIZER_MOUNT = "/tokenizer"
GRAFANA_DASHBOARDS_MOUNT = "/etc/grafana/dashboards"
ENGINE_CHECK_MOUNT = "/opt/trtllm-pipeline/engine_runtime.py"
OPENAI_FORM_MOUNT = "/trtllm_serve"
CONTAINER_HTTP_PORT = 8000
CONTAINER_GRPC_PORT = 8001
CONTAINER_METRICS_PORT = 8002
OPENAI_PORT = 9000  # the OpenAI-compatible front end (cpu profile), in the container and published
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
MONITORING_BIND_ADDRESS = "127.0.0.1"  # Prometheus and Grafana are never published beyond loopback

# Service names (the Triton service is `triton` in either profile, so Prometheus scrapes one name).
TRITON_SERVICE = "triton"
OPENAI_SERVICE = "openai"
PROMETHEUS_SERVICE = "prometheus"
GRAFANA_SERVICE = "grafana"
TRTLLM_SERVE_SERVICE = "trtllm-serve"  # the OpenAI-compatible server of a target in NVIDIA's llmapi layout

# The deployment's secrets (a compose deployment interpolates them from .env).
ADMIN_KEY_VARIABLE = "TRITON_ADMIN_KEY"
GRAFANA_PASSWORD_VARIABLE = "GRAFANA_ADMIN_PASSWORD"
ADMIN_KEY_HEADER = "admin-key"
# The OpenAI front end's API keys (clients.api_keys syntax): compose passes the variable, Kubernetes mounts the Secret's
# entry as a file. A generated deployment holds one key, named so in the front end's metrics.
OPENAI_API_KEYS_VARIABLE = API_KEYS_VARIABLE
GENERATED_API_KEY_NAME = "default"
API_KEYS_MOUNT = "/run/secrets/trtllm-pipeline"
API_KEYS_FILE = "api-keys"


def container_facts(target: str | Target) -> ComposeFacts:
    """How the target's Triton runs in a container (its backend's facts); refused for a target without a deployment."""
    facts = backend_for(Target(target)).compose
    if facts is None:
        deployable = ", ".join(t.value for t in Target if backend_for(t).compose is not None)
        raise SpecError(
            f"build.target {Target(target).value!r} has no docker compose deployment yet; deployable targets: {deployable}",
            hint="deploy the engine target (profile gpu) or the cpu target (profile cpu)",
        )
    return facts

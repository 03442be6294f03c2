"""The kubernetes deploy kind, checked without a cluster: golden manifests; every core resource through
kubernetes-validate --strict at the oldest and newest Kubernetes version supported (OLDEST, NEWEST); the
LeaderWorkerSet, PodMonitor and PrometheusRule against their CRDs' openAPIV3Schema (vendored under
tests/data/crds with their licences) with jsonschema, unknown fields refused as the API server's strict field
validation refuses them; `kubectl kustomize` of every overlay (where kubectl is installed; otherwise the
kustomizations are resolved here: every listed path exists and every document is a resource); the hardening,
GPU and autoscaling facts one by one; the init container's manifest check against a real artifact.

Regenerate the goldens: `UPDATE_GOLDEN=1 pytest tests/pipeline/deploy/test_kubernetes_deploy.py`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.kubernetes import KubernetesDeployer, kustomize, names, rendered_files, resources, verify_artifacts
from pipeline.deploy.server_command import world_size_of
from tests.pipeline.deploy.test_deploy import GOLDEN, REPO, SECRETS, check_golden, load_spec

OLDEST, NEWEST = "1.28.0", "1.37.0"
CRDS = REPO / "tests" / "data" / "crds"
CRD_SCHEMAS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_LeaderWorkerSet_v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_PodMonitor_v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_ServiceMonitor_v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_PrometheusRule_v1.json",
}
CONFIGS = ("tiny-cpu", "llama-3.1-8b-fp8-k8s", "llama-3.3-70b-fp8-2node")
KUBECTL = shutil.which("kubectl")


@cache
def spec_of(name: str) -> Spec:
    if name == "tiny-cpu":  # `--set deploy.kind=kubernetes` on the default config
        data = load_spec(name).model_dump(mode="json")
        data["deploy"]["kind"] = "kubernetes"
        return Spec.model_validate(data)
    return load_spec(name)


@cache
def texts(name: str) -> dict[str, str]:
    return rendered_files(spec_of(name))


@cache
def documents(name: str) -> tuple[dict[str, Any], ...]:
    """Shared between tests: a test that changes one copies it first."""
    return tuple(
        document
        for path, text in texts(name).items()
        if not path.endswith(names.KUSTOMIZATION)
        for document in yaml.safe_load_all(text)
        if document is not None
    )


def of_kind(name: str, kind: str) -> list[dict[str, Any]]:
    return [document for document in documents(name) if document["kind"] == kind]


def pod_templates(name: str) -> list[dict[str, Any]]:
    found = []
    for document in documents(name):
        if document["kind"] == "Deployment":
            found.append(document["spec"]["template"])
        elif document["kind"] == "LeaderWorkerSet":
            template = document["spec"]["leaderWorkerTemplate"]
            found += [template["leaderTemplate"], template["workerTemplate"]]
    return found


def golden_text(name: str) -> str:
    return golden_of(texts(name))


def golden_of(rendered: dict[str, str]) -> str:
    """Every file, one after another; the scripts' bodies (copies of project files) as their SHA-256."""
    parts = []
    for path, text in rendered.items():
        if path.endswith("/scripts.yaml"):
            document = yaml.safe_load_all(text)
            config_map = next(d for d in document if d)
            digests = {key: hashlib.sha256(value.encode()).hexdigest() for key, value in config_map["data"].items()}
            text = f"# ConfigMap {config_map['metadata']['name']}: {json.dumps(digests, indent=1, sort_keys=True)}\n"
        parts.append(f"# ==== {path}\n{text}")
    return "".join(parts)


# -- goldens and validators ----------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_manifests_match_golden_file(name):
    check_golden(GOLDEN / f"{name}.kubernetes.yaml", golden_text(name))


@pytest.fixture(scope="module")
def kubernetes_validate():
    """The package, its schema files read once (it re-reads the definitions, megabytes of JSON, per resource)."""
    module = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    patch = pytest.MonkeyPatch()
    patch.setattr(module.utils, "schema_contents", cache(module.utils.schema_contents))
    yield module
    patch.undo()


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("name", CONFIGS)
def test_core_resources_pass_kubernetes_validate_strict(name, version, kubernetes_validate):
    core = [document for document in documents(name) if (document["apiVersion"], document["kind"]) not in CRD_SCHEMAS]
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Namespace"} <= {d["kind"] for d in core}
    for document in core:
        kubernetes_validate.validate(document, version, strict=True)


def test_kubernetes_validate_strict_refuses_an_unknown_field(kubernetes_validate):
    deployment = json.loads(json.dumps(of_kind("tiny-cpu", "Deployment")[-1]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, NEWEST, strict=True)


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused wherever the API server would refuse them."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@cache
def crd_validator(api_version: str, kind: str):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CRDS / CRD_SCHEMAS[(api_version, kind)]).read_text())["openAPIV3Schema"]
    schema = _strict(schema)
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's, not the CRD's
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("name", CONFIGS)
def test_custom_resources_match_their_vendored_crds(name):
    custom = [document for document in documents(name) if (document["apiVersion"], document["kind"]) in CRD_SCHEMAS]
    kinds = {document["kind"] for document in custom}
    assert {"PodMonitor", "PrometheusRule"} <= kinds
    assert ("LeaderWorkerSet" in kinds) == (name == "llama-3.3-70b-fp8-2node")
    for document in custom:
        errors = sorted(crd_validator(document["apiVersion"], document["kind"]).iter_errors(document), key=str)
        assert not errors, f"{document['kind']}: " + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def test_vendored_crds_keep_their_licences_and_refuse_unknown_fields():
    assert (CRDS / "LICENSE.lws").read_text().lstrip().startswith("Apache License")
    assert (CRDS / "LICENSE.prometheus-operator").read_text().lstrip().startswith("Apache License")
    monitor = json.loads(json.dumps(of_kind("tiny-cpu", "PodMonitor")[0]))
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "5s"
    assert list(crd_validator("monitoring.coreos.com/v1", "PodMonitor").iter_errors(monitor))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """The manifests of every config on disk, with a secret.env as the deploy stage writes it."""
    root = tmp_path_factory.mktemp("kubernetes")
    out = {}
    for name in CONFIGS:
        for path, text in texts(name).items():
            (root / name / path).parent.mkdir(parents=True, exist_ok=True)
            (root / name / path).write_text(text)
        (root / name / names.BASE_DIR / names.SECRET_ENV).write_text(
            "".join(f"{variable}={SECRETS[variable]}\n" for variable in (layout.ADMIN_KEY_VARIABLE, layout.OPENAI_API_KEYS_VARIABLE))
        )
        out[name] = root / name
    return out


def _overlays(name: str) -> list[str]:
    return [directory for directory in (names.MONITORING_OVERLAY, names.AUTOSCALING_OVERLAY) if f"{directory}/{names.KUSTOMIZATION}" in texts(name)]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_overlay_builds_with_kustomize(name, written):
    """`kubectl kustomize` (kustomize v5, built into kubectl) where it is installed; else the kustomizations are
    resolved here (lint_directory: listed paths exist, documents are resources), which is weaker: no generators."""
    if KUBECTL is None:
        assert KubernetesDeployer().check(written[name]) == []
        pytest.skip("kubectl is not installed: the kustomizations were resolved by pipeline.deploy.kubernetes.checks only")
    for overlay in _overlays(name):
        result = subprocess.run([KUBECTL, "kustomize", str(written[name] / overlay)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        built = [d for d in yaml.safe_load_all(result.stdout) if d]
        namespace = spec_of(name).deploy.kubernetes_settings.namespace
        assert all(d["metadata"].get("namespace") == namespace for d in built if d["kind"] != "Namespace")
        [secret] = [d for d in built if d["kind"] == "Secret"]
        referenced = json.dumps([d for d in built if d["kind"] in ("Deployment", "LeaderWorkerSet")])
        assert secret["metadata"]["name"] in referenced  # the generator's hashed name reached the workloads
        layers = (names.BASE_DIR, names.MONITORING_OVERLAY, *((names.AUTOSCALING_OVERLAY,) if overlay == names.AUTOSCALING_OVERLAY else ()))
        rendered = sum(len([d for d in yaml.safe_load_all(text) if d]) for path, text in texts(name).items() if path.rsplit("/", 1)[0] in layers)
        kustomizations = len(layers)
        assert len(built) == rendered - kustomizations + 1  # every resource of its layers, and the generated Secret


def test_check_finds_a_missing_resource(written, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(written["tiny-cpu"], copy)
    assert KubernetesDeployer().check(copy) == []
    (copy / names.BASE_DIR / "services.yaml").unlink()
    assert any("services.yaml, which does not exist" in problem for problem in KubernetesDeployer().check(copy))


# -- facts, one by one ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_every_pod_is_hardened(name):
    for template in pod_templates(name):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        leader = template["metadata"]["labels"].get("role") == "leader"
        assert pod["automountServiceAccountToken"] is leader  # only the LWS leader talks to the API (kubectl exec)
        for container in pod["containers"] + pod.get("initContainers", []):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert all(mount.get("readOnly") for mount in container["volumeMounts"] if mount["name"] == "models")


def test_gpu_requests_are_the_ranks_or_a_node_and_shm_is_memory():
    [deployment] = [d for d in of_kind("llama-3.1-8b-fp8-k8s", "Deployment") if d["metadata"]["name"].endswith("-triton")]
    triton = deployment["spec"]["template"]["spec"]
    assert triton["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in triton["volumes"]
    assert "nvidia.com/gpu" not in json.dumps(documents("tiny-cpu"))
    [lws] = of_kind("llama-3.3-70b-fp8-2node", "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    for role in ("leaderTemplate", "workerTemplate"):
        assert template[role]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}


def test_the_leader_launches_every_rank_over_its_group():
    [lws] = of_kind("llama-3.3-70b-fp8-2node", "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["command"][-1].endswith(names.LEADER_SCRIPT) and "--" in leader["command"]  # after the engine check
    assert world_size_of(["mpirun", *leader["args"]]) == 16
    assert sum("--model-control-mode=none" in arg for arg in leader["args"]) == 1  # rank 0 alone serves
    [scripts] = [d for d in of_kind("llama-3.3-70b-fp8-2node", "ConfigMap") if d["metadata"]["name"].endswith("-scripts")]
    launch = scripts["data"][names.LEADER_SCRIPT]
    assert "plm_rsh_agent" in launch and f"{names.LWS_WORKER_INDEX_LABEL}!=0" in launch
    assert "kubectl exec" in scripts["data"][names.KUBESSH_SCRIPT]
    roles = {d["kind"]: d for d in of_kind("llama-3.3-70b-fp8-2node", "Role")}
    assert roles["Role"]["rules"][1] == {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}


def test_probes_use_triton_health_endpoints():
    [deployment] = [d for d in of_kind("tiny-cpu", "Deployment") if d["metadata"]["name"].endswith("-triton")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 180
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_autoscaler_reads_the_metric_the_adapter_rule_defines():
    [hpa] = of_kind("llama-3.1-8b-fp8-k8s", "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["target"] == {"type": "AverageValue", "averageValue": "500m"}
    [adapter] = [d for d in of_kind("llama-3.1-8b-fp8-k8s", "ConfigMap") if "config.yaml" in d.get("data", {})]
    [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric["metric"]["name"] == resources.AUTOSCALING_METRIC
    assert "rate(nv_inference_queue_duration_us{" in rule["metricsQuery"]
    assert "clamp_min(sum by (<<.GroupBy>>) (rate(nv_inference_compute_infer_duration_us{" in rule["metricsQuery"]
    [workload] = [d for d in of_kind("llama-3.1-8b-fp8-k8s", "Deployment") if d["metadata"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]]
    assert workload["spec"]["replicas"] == 1
    assert not of_kind("tiny-cpu", "HorizontalPodAutoscaler")


def test_services_and_the_openai_front_end():
    services = {d["metadata"]["name"]: d for d in of_kind("llama-3.1-8b-fp8-k8s", "Service")}
    triton = services["llama-3-1-8b-fp8-k8s-triton"]
    assert [(p["name"], p["port"]) for p in triton["spec"]["ports"]] == [("http", 8000), ("grpc", 8001), ("metrics", 8002)]
    assert services["llama-3-1-8b-fp8-k8s-openai"]["spec"]["ports"][0]["port"] == 9000
    openai = [d for d in of_kind("llama-3.1-8b-fp8-k8s", "Deployment") if d["metadata"]["name"].endswith("-openai")][0]
    pod = openai["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert args[args.index("--triton-url") + 1] == "llama-3-1-8b-fp8-k8s-triton:8001"
    # the API keys: the Secret's entry mounted as a file, named on the command line by its path only (#36)
    assert args[args.index("--api-key-file") + 1] == "/run/secrets/trtllm-pipeline/api-keys"
    [volume] = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"] == {
        "secretName": "llama-3-1-8b-fp8-k8s-secrets",
        "items": [{"key": "TRTLLM_PIPELINE_API_KEYS", "path": "api-keys"}],
        "defaultMode": 0o440,
    }
    assert {"name": "api-keys", "mountPath": "/run/secrets/trtllm-pipeline", "readOnly": True} in container["volumeMounts"]
    assert not any("TRTLLM_PIPELINE_API_KEYS" in json.dumps(entry) for entry in container["env"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/health" and "tcpSocket" in container["livenessProbe"]
    [lws_service] = [d for d in of_kind("llama-3.3-70b-fp8-2node", "Service") if d["metadata"]["name"].endswith("-triton")]
    assert lws_service["spec"]["selector"]["role"] == "leader"


def test_prometheus_rule_carries_the_rules_every_kind_renders():
    from pipeline.deploy import rules

    [rule] = of_kind("tiny-cpu", "PrometheusRule")
    assert rule["spec"]["groups"] == rules.rule_groups(spec_of("tiny-cpu"))
    monitors = {monitor["metadata"]["labels"][names.COMPONENT_LABEL]: monitor for monitor in of_kind("tiny-cpu", "PodMonitor")}
    assert set(monitors) == {names.TRITON, names.OPENAI}  # the job labels the rules select: triton, openai (TTFT / ITL)
    for component, port in ((names.TRITON, "metrics"), (names.OPENAI, "http")):
        spec = monitors[component]["spec"]
        assert spec["jobLabel"] == names.COMPONENT_LABEL and spec["podMetricsEndpoints"][0]["relabelings"][0]["targetLabel"] == "build"
        assert spec["selector"]["matchLabels"][names.COMPONENT_LABEL] == component and spec["podMetricsEndpoints"][0]["port"] == port
    [openai] = [d for d in of_kind("tiny-cpu", "Deployment") if d["metadata"]["labels"][names.COMPONENT_LABEL] == names.OPENAI]
    assert {"name": "http", "containerPort": 9000, "protocol": "TCP"} in openai["spec"]["template"]["spec"]["containers"][0]["ports"]


def test_kustomize_lists_what_is_rendered():
    spec = spec_of("llama-3.1-8b-fp8-k8s")
    built = kustomize.kustomizations(spec, kustomize.manifests(spec))
    assert built[names.AUTOSCALING_OVERLAY]["resources"] == ["../monitoring", "autoscaling.yaml"]
    assert built[names.BASE_DIR]["secretGenerator"] == [{"name": "llama-3-1-8b-fp8-k8s-secrets", "envs": ["secret.env"]}]
    assert kustomize.default_overlay(spec) == names.AUTOSCALING_OVERLAY


# -- the init container's check ------------------------------------------------------------------
def test_verify_script_checks_a_real_artifact_against_its_manifest(tmp_path, capsys):
    from pipeline.artifacts import ArtifactStore
    from pipeline.plan import StagePlan

    store = ArtifactStore(tmp_path / "store", "b")
    with store.create(StagePlan("build", "e" * 16, {}, {}, {}, "build"), build_name="b") as directory:
        (directory / "engine").mkdir()
        (directory / "engine" / "rank0.engine").write_bytes(b"\x00" * 4096)
        (directory / "engine" / "config.json").write_text("{}")
    [artifact] = [path for path in (tmp_path / "store" / "b").iterdir() if path.name.startswith("build-")]
    assert verify_artifacts.main([str(artifact)]) == 0
    (artifact / "engine" / "rank0.engine").write_bytes(b"\x01" + b"\x00" * 4095)
    (artifact / "engine" / "stray.bin").write_bytes(b"")
    assert verify_artifacts.main([str(artifact)]) == 1
    err = capsys.readouterr().err
    assert "rank0.engine: SHA-256 differs" in err and "stray.bin: not in the manifest" in err
    assert verify_artifacts.problems(str(tmp_path))[0].endswith(f"no readable manifest.json ([Errno 2] No such file or directory: '{tmp_path}/manifest.json')")

"""deploy.kind kubernetes for build.target llmapi, both forms (deploy.kubernetes.llmapi_form): goldens; every core
resource through kubernetes-validate --strict (oldest and newest Kubernetes), the monitoring CRs against their
vendored CRDs; the Triton form's structure without the project's OpenAI front end; the trtllm-serve form's command,
probes and options ConfigMap against NVIDIA's recorded CLI and routes (tests/data/llmapi_1_2_1_llm_args.json,
tensorrt_llm/serve/openai_server.py); a dry run end to end through `kubectl kustomize`; the bad inputs `validate`
refuses. Regenerate the goldens: `UPDATE_GOLDEN=1 pytest tests/pipeline/deploy/test_llmapi_kubernetes.py`."""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.backends.llmapi.forms import serve_options_yaml
from pipeline.backends.llmapi.options import build_options, merged_options, serve_options
from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.deploy.kubernetes import kustomize, llmapi_forms, names, rendered_files
from tests.pipeline.backends.test_llmapi_target import EXAMPLE, RECORDED
from tests.pipeline.deploy.test_deploy import GOLDEN, check_golden
from tests.pipeline.deploy.test_kubernetes_deploy import CRD_SCHEMAS, NEWEST, OLDEST, crd_validator, golden_of, kubernetes_validate  # noqa: F401

ON_KUBERNETES = ["deploy.kind=kubernetes", "deploy.gpus=[]"]
FORMS = {"triton": [], "trtllm-serve": ["deploy.kubernetes.llmapi_form=trtllm-serve"]}
KUBECTL = shutil.which("kubectl")


@cache
def loaded(form: str, *extra: str):
    return load_config(EXAMPLE, [*ON_KUBERNETES, *FORMS[form], *extra])


def options_text(form: str, *extra: str) -> str:
    config = loaded(form, *extra)
    return serve_options_yaml(merged_options(build_options(config.spec, config.model), serve_options(config.spec.serve)))


@cache
def texts(form: str, *extra: str) -> dict[str, str]:
    return rendered_files(loaded(form, *extra).spec, options_text(form, *extra))


def documents(form: str, *extra: str) -> list[dict[str, Any]]:
    return [
        document
        for path, text in texts(form, *extra).items()
        if not path.endswith(names.KUSTOMIZATION)
        for document in yaml.safe_load_all(text)
        if document is not None
    ]


def of_kind(form: str, kind: str, *extra: str) -> list[dict[str, Any]]:
    return [document for document in documents(form, *extra) if document["kind"] == kind]


@pytest.mark.parametrize("form", FORMS)
def test_manifests_match_golden_file(form):
    check_golden(GOLDEN / f"llama-3.1-8b-fp8-llmapi-{form}.kubernetes.yaml", golden_of(texts(form)))


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("form", FORMS)
def test_core_resources_pass_kubernetes_validate_strict(form, version, kubernetes_validate):  # noqa: F811
    core = [document for document in documents(form) if (document["apiVersion"], document["kind"]) not in CRD_SCHEMAS]
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Namespace"} <= {d["kind"] for d in core}
    for document in core:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_triton_form_keeps_the_engine_structure_without_the_openai_front_end():
    custom = [document for document in documents("triton") if (document["apiVersion"], document["kind"]) in CRD_SCHEMAS]
    assert {document["kind"] for document in custom} == {"PodMonitor", "PrometheusRule"}
    for document in custom:
        assert not list(crd_validator(document["apiVersion"], document["kind"]).iter_errors(document))
    assert [d["metadata"]["name"] for d in of_kind("triton", "Deployment")] == ["llama-3-1-8b-fp8-llmapi-triton"]
    assert [d["metadata"]["name"] for d in of_kind("triton", "Service")] == ["llama-3-1-8b-fp8-llmapi-triton"]
    assert "openai" not in json.dumps(documents("triton"))  # the front end speaks the ensemble's tensors, not the llmapi model's
    [container] = of_kind("triton", "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert kustomize.default_overlay(loaded("triton").spec) == names.MONITORING_OVERLAY


def test_tensor_parallel_triton_runs_one_server_whose_llm_starts_the_ranks():
    extra = ("build.tp_size=2", "deploy.gpus_per_node=8")
    [deployment] = of_kind("triton", "Deployment", *extra)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "tritonserver" and "mpirun" not in json.dumps(container)
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_the_trtllm_serve_form_runs_nvidias_cli_on_the_same_options():
    [config_map, deployment] = yaml.safe_load_all(texts("trtllm-serve")[f"{names.BASE_DIR}/trtllm-serve.yaml"].split("\n", 1)[1])
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    argv = container["command"] + container["args"]
    assert argv[:2] == ["trtllm-serve", "/engine"] and container["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    assert {token for token in argv[2:] if token.startswith("--")} <= set(RECORDED["trtllm_serve"]["flags"])
    options_file = argv[argv.index("--extra_llm_api_options") + 1]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == llmapi_forms.OPTIONS_VOLUME]
    assert options_file == f"{mount['mountPath']}/extra-llm-api-config.yml"
    assert config_map["data"] == {"extra-llm-api-config.yml": options_text("trtllm-serve")}
    served = yaml.safe_load(config_map["data"]["extra-llm-api-config.yml"])
    assert served["kv_cache_config"]["dtype"] == "fp8" and "backend" not in served and "model" not in served
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert "/health" in RECORDED["trtllm_serve"]["endpoints"]
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 900
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_trtllm_serve_form_has_its_service_and_no_monitoring_overlay():
    [service] = of_kind("trtllm-serve", "Service")
    assert service["metadata"]["name"] == "llama-3-1-8b-fp8-llmapi-trtllm-serve"
    assert service["spec"]["selector"][names.COMPONENT_LABEL] == llmapi_forms.TRTLLM_SERVE
    assert service["spec"]["ports"] == [{"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}]
    [budget] = of_kind("trtllm-serve", "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"][names.COMPONENT_LABEL] == llmapi_forms.TRTLLM_SERVE
    # /metrics answers JSON iteration stats; Prometheus text needs return_perf_metrics (not rendered)
    assert not [path for path in texts("trtllm-serve") if "overlays" in path]
    assert not of_kind("trtllm-serve", "PodMonitor")
    assert kustomize.default_overlay(loaded("trtllm-serve").spec) == names.BASE_DIR


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> Path:
    """The example's dry run with the trtllm-serve form: the deploy stage renders the ConfigMap from the build."""
    store = tmp_path_factory.mktemp("artifacts")
    overrides = [token for setting in [*ON_KUBERNETES, *FORMS["trtllm-serve"]] for token in ("--set", setting)]
    assert main(["--artifacts", str(store), "run", str(EXAMPLE), "--runner", "dry-run", *overrides]) == 0
    [deploy] = sorted((store / "llama-3.1-8b-fp8-llmapi").glob("deploy-*/deploy"))
    return deploy


def test_a_dry_run_deploys_the_trtllm_serve_form_the_package_stage_rendered(deployed):
    base = deployed / names.BASE_DIR
    if KUBECTL is not None:
        result = subprocess.run([KUBECTL, "kustomize", str(base)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        built = [document for document in yaml.safe_load_all(result.stdout) if document]
    else:  # pragma: no cover - kubectl is installed where CI runs
        built = [d for path in base.glob("*.yaml") if path.name != names.KUSTOMIZATION for d in yaml.safe_load_all(path.read_text()) if d]
    assert {d["metadata"].get("namespace") for d in built if d["kind"] != "Namespace"} == {"trtllm"}
    [config_map] = [d for d in built if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-trtllm-serve")]
    assert config_map["data"]["extra-llm-api-config.yml"] == (deployed / "trtllm_serve" / "extra-llm-api-config.yml").read_text()
    assert [d["kind"] for d in built if d["kind"] in ("Deployment", "PodMonitor")] == ["Deployment"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["build.tp_size=8", "deploy.gpus_per_node=4"],
            "build.tp_size × build.pp_size (8) > deploy.gpus_per_node (4) is refused for build.target llmapi on deploy.kind kubernetes: "
            "NVIDIA launches the LLM API across nodes with trtllm-llmapi-launch",
        ),
        (
            ["deploy.kubernetes.llmapi_form=trtllm-serve", "deploy.kubernetes.autoscaling.max_replicas=2"],
            "deploy.kubernetes.autoscaling is refused with deploy.kubernetes.llmapi_form trtllm-serve (build.target llmapi)",
        ),
    ],
)
def test_validate_refuses_what_the_llmapi_forms_do_not_run_on_kubernetes(tmp_path, capsys, overrides, message):
    settings = [token for setting in [*ON_KUBERNETES, *overrides] for token in ("--set", setting)]
    assert main(["--artifacts", str(tmp_path), "validate", str(EXAMPLE), *settings]) != 0
    assert message in " ".join(capsys.readouterr().err.split())


def test_validate_refuses_an_llmapi_form_on_another_target(tmp_path, capsys):
    engine = Path(EXAMPLE).parent / "llama-3.1-8b-fp8-k8s.yaml"
    assert main(["--artifacts", str(tmp_path), "validate", str(engine), "--set", "deploy.kubernetes.llmapi_form=trtllm-serve"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "deploy.kubernetes.llmapi_form trtllm-serve is for build.target llmapi; build.target engine has one form" in err

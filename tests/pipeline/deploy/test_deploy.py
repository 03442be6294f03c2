"""The docker compose deployment: golden files, the Compose Specification schema, the checks
`docker compose config` would make, one assertion per hardening item (pipeline/deploy/compose/document.py
lists them and their sources), the deployment directory the deploy stage writes, and the checkout's docker-compose.yml.

Regenerate the golden files (and the root docker-compose.yml) explicitly:
`UPDATE_GOLDEN=1 pytest tests/pipeline/deploy/test_deploy.py`. The schema comes from
scripts/fetch_compose_schema.sh (<venv>/share/compose_spec.json); without it those tests skip.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from clients.api_keys import parse_api_keys
from pipeline.artifacts import ArtifactRef
from pipeline.backends.cpu.target import cpu_build_config
from pipeline.config.spec import Spec
from pipeline.deploy import images, layout, monitoring, rules
from pipeline.deploy.compose import (
    COMPOSE_FILE,
    ENV_FILE,
    compose_up,
    dump_compose,
    export_deployment,
    lint_compose,
    render_compose,
    render_root_compose,
    write_deployment,
)
from pipeline.deploy.compose.checks import duration_seconds, interpolate, is_pinned, parse_port
from pipeline.deploy.compose.document import deployment_header
from pipeline.deploy.compose.writer import read_env
from pipeline.deploy.dockerfile import render_dockerfile
from pipeline.deploy.images import server_image
from pipeline.deploy.server_command import CPU_BACKEND_DIR, CPU_TRITONSERVER_ROOT, EXIT_TIMEOUT_SECS, RESTRICTED_APIS, world_size_of
from pipeline.errors import SpecError, StageError, ToolError
from pipeline.plan import StagePlan
from pipeline.render import RepositoryRequest, render_model_repository
from pipeline.stages import deploy as deploy_stage

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "deploy"
ROOT_COMPOSE = REPO / "docker-compose.yml"
SCHEMA = Path(sys.prefix) / "share" / "compose_spec.json"
TOKENIZER_SOURCE = REPO / "models" / "tiny-stdlib-llama"
CONFIGS = ("tiny-cpu", "llama-3.1-8b-fp8", "llama-3.3-70b-fp8-tp2")
GPU_CONFIGS = ("llama-3.1-8b-fp8", "llama-3.3-70b-fp8-tp2")
SECRETS = {
    "TRITON_ADMIN_KEY": "test-admin-key-0123456789",
    "GRAFANA_ADMIN_PASSWORD": "test-grafana-password-0123",
    "TRTLLM_PIPELINE_API_KEYS": "ci:test-api-key-0123456789,test-api-key-9876543210",
}


# -- helpers ------------------------------------------------------------------------------------
def load_spec(name: str) -> Spec:
    return Spec.model_validate(yaml.safe_load((REPO / "build_configs" / f"{name}.yaml").read_text()))


def render(name: str) -> dict:
    spec = load_spec(name)
    return render_compose(
        spec,
        model_repository=Path(layout.MODEL_REPOSITORY_DIR),
        engine_dir=Path(layout.ENGINE_LINK),
        tokenizer_dir=Path(layout.TOKENIZER_LINK),
        target=spec.build.target.value,
    )


def render_text(name: str) -> str:
    spec = load_spec(name)
    return dump_compose(render(name), deployment_header(spec, spec.build.target.value))


def triton(name: str) -> dict:
    return render(name)["services"]["triton"]


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.skip(f"golden file rewritten: {path}")
    assert path.is_file(), f"{path} is missing; create it with UPDATE_GOLDEN=1"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"{path.name} differs from the rendering; if intended, regenerate with UPDATE_GOLDEN=1\n{diff}")


def flag_values(command: list[str], flag: str) -> list[str]:
    return [token.split("=", 1)[1] for token in command if token.startswith(f"{flag}=")]


@pytest.fixture(scope="module")
def schema_validator():
    if not SCHEMA.is_file():
        pytest.skip(f"{SCHEMA} is absent: run scripts/fetch_compose_schema.sh {sys.prefix} (the Makefile's venv step does)")
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (pip install jsonschema)")
    return jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))


# -- golden files, schema, compose-config checks -----------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_compose_matches_golden_file(name):
    check_golden(GOLDEN / f"{name}.docker-compose.yml", render_text(name))


def test_cpu_dockerfile_matches_golden_file():
    spec = load_spec("tiny-cpu")
    image = server_image(spec, "cpu")
    text = render_dockerfile(build_name=spec.name, base_image=image.reference, base_image_note=image.note, torch_index=spec.deploy.torch_index_url)
    check_golden(GOLDEN / "tiny-cpu.Dockerfile", text)


def test_the_torch_index_comes_from_the_spec():
    spec = load_spec("tiny-cpu")
    text = render_dockerfile(build_name=spec.name, base_image="python:3.11", base_image_note="test", torch_index="http://mirror.local/torch-cpu")
    assert "pip install --index-url http://mirror.local/torch-cpu torch==" in text
    with pytest.raises(ValueError, match="torch_index_url"):
        spec.deploy.model_validate({**spec.deploy.model_dump(), "torch_index_url": "not a url"})


def test_rendering_is_deterministic():
    for name in CONFIGS:
        assert render_text(name) == render_text(name)


@pytest.mark.parametrize("name", [*CONFIGS, "root"])
def test_compose_validates_against_the_compose_schema(schema_validator, name):
    document = yaml.safe_load(ROOT_COMPOSE.read_text() if name == "root" else render_text(name))
    errors = sorted(error.message for error in schema_validator.iter_errors(document))
    assert errors == []


def test_schema_check_is_not_vacuous(schema_validator):
    document = yaml.safe_load(render_text("tiny-cpu"))
    document["services"]["triton"]["gpus_typo"] = "all"
    document["name"] = "not in the 1.29.2 schema"
    assert len(list(schema_validator.iter_errors(document))) == 2


@pytest.mark.parametrize("name", CONFIGS)
def test_compose_passes_the_compose_config_checks(name):
    assert lint_compose(yaml.safe_load(render_text(name)), env=SECRETS) == []


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["services"]["triton"]["ports"].append("127.0.0.1:9090:9090"), "host port 9090 is also published"),
        (lambda d: d["services"]["triton"]["ports"].append("localhost:1:1"), "'localhost:1:1'"),
        (lambda d: d["services"]["triton"]["ports"].append("127.0.0.1:70000:1"), "1..65535"),
        (lambda d: d["services"]["triton"]["volumes"][0].update(source="model_repository"), "must start with ./"),
        (lambda d: next(v for v in d["services"]["prometheus"]["volumes"] if v["type"] == "volume").update(source="undeclared"), "not declared"),
        (lambda d: d["services"]["prometheus"].update(profiles=["other"]), "disabled under profile(s) cpu"),
        (lambda d: d["services"]["triton"].update(stop_grace_period="90 seconds"), "is not a duration"),
        (lambda d: d["services"]["triton"].update(shm_size="2 GB"), "is not a size"),
        (lambda d: d["services"]["triton"]["healthcheck"].update(test=["curl", "x"]), "must start with CMD"),
        (lambda d: d["services"]["triton"]["environment"].update(X=1), "as a quoted string"),
        (lambda d: d["services"]["grafana"].update(image="grafana/grafana:latest"), "is not pinned"),
        (lambda d: d["services"]["triton"]["command"].append("${BROKEN"), "unterminated"),
        (lambda d: d.update(name="x"), "unknown key 'name'"),
    ],
)
def test_compose_checks_catch_what_the_schema_lets_through(mutate, expected):
    document = yaml.safe_load(render_text("tiny-cpu"))
    mutate(document)
    problems = lint_compose(document, env=SECRETS)
    assert any(expected in problem for problem in problems), problems


def test_every_interpolated_variable_comes_from_env():
    document = yaml.safe_load(render_text("tiny-cpu"))
    problems = lint_compose(document, env={"TRITON_ADMIN_KEY": SECRETS["TRITON_ADMIN_KEY"]})
    assert problems == [
        "services.openai.environment.TRTLLM_PIPELINE_API_KEYS: TRTLLM_PIPELINE_API_KEYS: set TRTLLM_PIPELINE_API_KEYS in .env",
        "services.grafana.environment.GF_SECURITY_ADMIN_PASSWORD: GRAFANA_ADMIN_PASSWORD: set GRAFANA_ADMIN_PASSWORD in .env",
    ]
    assert interpolate("a=${X:-d} b=$${Y} c=${Z}", {"Z": "z"}) == "a=d b=${Y} c=z"


def test_check_helpers():
    assert parse_port("[::1]:8000:8001") == ("::1", 8000, 8001, "tcp")
    assert parse_port("8000") == (None, None, 8000, "tcp")
    assert duration_seconds("1m30s") == 90.0
    assert is_pinned("a/b:1.0") and is_pinned("a@sha256:00") and not is_pinned("a/b") and not is_pinned("a:latest")
    with pytest.raises(ValueError):
        duration_seconds("90")


# -- hardening, one item at a time -----------------------------------------------------------------
@pytest.mark.parametrize("name, device_ids", [("llama-3.1-8b-fp8", ["0"]), ("llama-3.3-70b-fp8-tp2", ["0", "1"])])
def test_gpu_reservation_names_the_engines_gpus(name, device_ids):
    [device] = triton(name)["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "device_ids": device_ids, "capabilities": ["gpu"]}
    assert triton(name)["profiles"] == ["gpu"]


def test_cpu_profile_has_no_gpu_reservation_and_builds_its_image():
    service = triton("tiny-cpu")
    assert "deploy" not in service and service["profiles"] == ["cpu"]
    assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    assert service["pull_policy"] == "build"  # the local image name is never pulled from a registry


@pytest.mark.parametrize("name, size", [("tiny-cpu", "2g"), ("llama-3.1-8b-fp8", "4g"), ("llama-3.3-70b-fp8-tp2", "8g")])
def test_shm_size_comes_from_the_spec(name, size):
    assert triton(name)["shm_size"] == size


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_profile_has_memlock_unlimited_and_64_mib_stack(name):
    assert triton(name)["ulimits"] == {"memlock": {"soft": -1, "hard": -1}, "stack": 67108864}


def test_cpu_profile_sets_no_memlock_limit():
    # raising RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE in the daemon ("error setting rlimit type 8"); refengine pins nothing
    assert triton("tiny-cpu")["ulimits"] == {"stack": 67108864}


def test_the_dockerfile_needs_no_frontend_image():
    # a `# syntax=` line makes BuildKit pull that frontend from Docker Hub: an offline build fails
    assert "# syntax=" not in (GOLDEN / "tiny-cpu.Dockerfile").read_text()


def test_openai_prometheus_and_grafana_host_ports_come_from_the_spec():
    spec = load_spec("tiny-cpu").model_copy(deep=True)
    deploy = spec.deploy.model_copy(update={"openai_port": 19000, "prometheus_port": 19090, "grafana_port": 13000})
    spec = spec.model_copy(update={"deploy": deploy})
    services = render_compose(
        spec,
        model_repository=Path(layout.MODEL_REPOSITORY_DIR),
        engine_dir=Path(layout.ENGINE_LINK),
        tokenizer_dir=Path(layout.TOKENIZER_LINK),
        target=spec.build.target.value,
    )["services"]
    assert services["openai"]["ports"] == ["127.0.0.1:19000:9000"]
    assert services["prometheus"]["ports"] == ["127.0.0.1:19090:9090"]
    assert services["grafana"]["ports"] == ["127.0.0.1:13000:3000"]


@pytest.mark.parametrize("field", ["openai_port", "prometheus_port", "grafana_port"])
def test_a_host_port_used_twice_is_refused_by_name(field):
    data = yaml.safe_load((REPO / "build_configs" / "tiny-cpu.yaml").read_text())
    data.setdefault("deploy", {}).update({"http_port": 8000, field: 8000})
    with pytest.raises(ValueError, match=rf"deploy.{field} \(8000\) is the same as deploy.http_port"):
        Spec.model_validate(data)


@pytest.mark.parametrize("name", CONFIGS)
def test_model_repository_engine_and_tokenizer_are_mounted_read_only(name):
    mounts = {volume["target"]: volume for volume in triton(name)["volumes"]}
    check = {"/opt/trtllm-pipeline/engine_runtime.py"} if name in GPU_CONFIGS else set()  # the entrypoint's engine check
    assert set(mounts) == {"/models", "/engine", "/tokenizer"} | check
    assert all(volume["type"] == "bind" and volume["read_only"] is True for volume in mounts.values())
    assert mounts["/models"]["source"] == "./model_repository"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_service_runs_hardened(name):
    for service_name, service in render(name)["services"].items():
        assert service["read_only"] is True, service_name
        assert service["tmpfs"][0].startswith("/tmp:"), service_name
        assert service["cap_drop"] == ["ALL"], service_name
        assert service["security_opt"] == ["no-new-privileges:true"], service_name
        assert service["restart"] == "unless-stopped", service_name
        assert service["logging"]["options"]["max-size"], service_name


@pytest.mark.parametrize("name", CONFIGS)
def test_triton_runs_as_non_root(name):
    user = triton(name)["user"]
    assert user == "1000:1000" and not user.startswith("0")
    dockerfile = (GOLDEN / "tiny-cpu.Dockerfile").read_text()
    assert "USER 1000:1000" in dockerfile


@pytest.mark.parametrize("name", CONFIGS)
def test_every_port_is_published_on_loopback(name):
    for service in render(name)["services"].values():
        for port in service["ports"]:
            address, host, container, _ = parse_port(port)
            assert address == "127.0.0.1", port
    spec = load_spec(name)
    assert [parse_port(p)[1] for p in triton(name)["ports"]] == [spec.deploy.http_port, spec.deploy.grpc_port, spec.deploy.metrics_port]


def test_ipv6_bind_address_is_bracketed_and_host_names_are_refused():
    spec = load_spec("tiny-cpu")
    spec = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"bind_address": "::1"})})
    document = render_compose(spec, model_repository=Path("r"), engine_dir=None, target="cpu")
    assert document["services"]["triton"]["ports"][0] == "[::1]:8000:8000"
    named = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"bind_address": "localhost"})})
    with pytest.raises(SpecError, match="not an IP address"):
        render_compose(named, model_repository=Path("r"), engine_dir=None, target="cpu")


@pytest.mark.parametrize("name", CONFIGS)
def test_admin_apis_are_restricted_and_model_control_is_off(name):
    command = triton(name)["command"]
    expected = ",".join(RESTRICTED_APIS) + ":admin-key=${TRITON_ADMIN_KEY:?set TRITON_ADMIN_KEY in .env}"
    ranks = world_size_of(command)
    assert flag_values(command, "--http-restricted-api") == [expected] * ranks
    assert flag_values(command, "--grpc-restricted-protocol") == [expected] * ranks
    assert set(RESTRICTED_APIS) >= {"model-repository", "model-config", "shared-memory", "logging", "trace", "statistics"}
    assert flag_values(command, "--model-control-mode")[0] == "none"  # rank 0 serves the whole repository
    for flag, value in (("--allow-sagemaker", "false"), ("--allow-vertex-ai", "false"), ("--strict-readiness", "true"), ("--exit-on-error", "true")):
        assert set(flag_values(command, flag)) == {value}, flag
    assert "--disable-auto-complete-config" in command


@pytest.mark.parametrize("name, start_period", [("tiny-cpu", 180), ("llama-3.1-8b-fp8", 900), ("llama-3.3-70b-fp8-tp2", 900)])
def test_healthcheck_hits_readiness_with_a_start_period_for_engine_load(name, start_period):
    health = triton(name)["healthcheck"]
    assert any("/v2/health/ready" in part for part in health["test"])
    assert health["test"][0] == "CMD"
    assert duration_seconds(health["start_period"]) >= start_period


@pytest.mark.parametrize("name", CONFIGS)
def test_stop_grace_period_outlasts_the_exit_timeout(name):
    service = triton(name)
    [exit_timeout] = set(flag_values(service["command"], "--exit-timeout-secs"))
    assert int(exit_timeout) == EXIT_TIMEOUT_SECS
    assert duration_seconds(service["stop_grace_period"]) > int(exit_timeout)
    assert service["init"] is True  # tini forwards SIGTERM and reaps the Python-backend stubs


def test_tp2_runs_two_ranks_under_mpirun_in_leader_mode():
    command = triton("llama-3.3-70b-fp8-tp2")["command"]
    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    assert world_size_of(command) == 2
    blocks = " ".join(command[2:]).split(" : ")
    assert [block.split()[:3] for block in blocks] == [["-n", "1", "tritonserver"]] * 2
    assert "--model-control-mode=none" in blocks[0] and "--load-model" not in blocks[0]
    assert "--model-control-mode=explicit" in blocks[1] and "--load-model=tensorrt_llm" in blocks[1]
    assert flag_values(command, "--backend-config") == ["python,shm-region-prefix-name=prefix0_", "python,shm-region-prefix-name=prefix1_"]
    assert triton("llama-3.3-70b-fp8-tp2")["environment"]["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


def test_tp1_starts_tritonserver_directly():
    command = triton("llama-3.1-8b-fp8")["command"]
    assert command[0] == "tritonserver" and "mpirun" not in command and world_size_of(command) == 1


def test_images_are_pinned():
    assert triton("llama-3.1-8b-fp8")["image"] == "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3"
    assert "no digest recorded" in render_text("llama-3.1-8b-fp8")  # said in the header comment
    for name in CONFIGS:
        services = render(name)["services"]
        assert "@sha256:" in services["prometheus"]["image"] and "@sha256:" in services["grafana"]["image"]
    assert "FROM python:3.11.13-slim-bookworm@sha256:" in (GOLDEN / "tiny-cpu.Dockerfile").read_text()


def test_multi_instance_multi_gpu_is_refused():
    spec = load_spec("llama-3.3-70b-fp8-tp2")
    spec = spec.model_copy(update={"serve": spec.serve.model_copy(update={"instances": spec.serve.instances.model_copy(update={"tensorrt_llm": 2})})})
    with pytest.raises(SpecError, match="leader mode"):
        render_compose(spec, model_repository=Path("r"), engine_dir=Path("e"), target="engine")


# -- monitoring ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_prometheus_scrapes_the_triton_metrics_port_and_the_openai_front_end(name):
    spec = load_spec(name)
    config = monitoring.prometheus_config(spec, spec.build.target.value)
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {"triton": ["triton:8002"], "openai": ["openai:9000"]}
    assert flag_values(triton(name)["command"], "--metrics-port")[0] == "8002"
    services = render(name)["services"]
    assert "triton" in services and "--port" in services["openai"]["command"]
    assert services["openai"]["command"][services["openai"]["command"].index("--port") + 1] == "9000"


def test_prometheus_has_no_openai_job_where_trtllm_serve_is_the_openai_endpoint():
    spec = load_spec("llama-3.1-8b-fp8-llmapi")
    assert [job["job_name"] for job in monitoring.prometheus_config(spec, "llmapi")["scrape_configs"]] == ["triton"]
    assert not any("openai" in rule["expr"] for group in rules.rule_groups(spec) for rule in group["rules"])  # nothing to read


def test_grafana_is_provisioned_with_the_dashboard():
    spec = load_spec("tiny-cpu")
    services = render("tiny-cpu")["services"]
    mounts = {volume["target"]: volume["source"] for volume in services["grafana"]["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    [provider] = monitoring.grafana_dashboard_providers()["providers"]
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    [datasource] = monitoring.grafana_datasources()["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and datasource["uid"] == monitoring.DATASOURCE_UID
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD")
    dashboard = json.loads(json.dumps(monitoring.dashboard(spec, "cpu")))
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert {"Throughput", "Request latency", "Queue time", "KV-cache usage"} <= set(titles)
    exprs = " ".join(target["expr"] for panel in dashboard["panels"] for target in panel["targets"])
    for family in ("nv_inference_request_success", "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_trt_llm_kv_cache_block_metrics"):
        assert family in exprs
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == datasource["uid"] and panel["targets"]


# Every panel's query names a metric the cpu model or Triton publishes: tests/model_repo/test_engine_metrics.py


# -- the deployment directory and the stage -------------------------------------------------------
def tiny_engine(directory: Path) -> Path:
    spec = load_spec("tiny-cpu")
    config = {
        "version": "refengine-0.1.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "logits_dtype": "float16",
            "vocab_size": 4096,
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": cpu_build_config(spec.build, max_seq_len=1024, dtype="float16"),
    }
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "rank0.safetensors").write_bytes(b"")
    return directory


def llama_engine(directory: Path, tp_size: int) -> Path:
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "logits_dtype": "float32",
            "vocab_size": 128256,
            "hidden_size": 8192,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "mapping": {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
        },
        "build_config": {
            "max_batch_size": 64,
            "max_input_len": 8192,
            "max_seq_len": 16384,
            "max_num_tokens": 8192,
            "max_beam_width": 1,
            "kv_cache_type": "PAGED",
            "gather_context_logits": False,
            "gather_generation_logits": False,
            "plugin_config": {
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "use_paged_context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "tokens_per_block": 32,
            },
        },
    }
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    for rank in range(tp_size):
        (directory / f"rank{rank}.engine").write_bytes(b"")
    return directory


def tokenizer(directory: Path) -> Path:
    shutil.copytree(TOKENIZER_SOURCE, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    return directory


def package_repository(spec: Spec, engine: Path, tokenizer_dir: Path, out: Path) -> Path:
    render_model_repository(
        RepositoryRequest(
            engine_dir=engine, tokenizer_dir=tokenizer_dir, serve=spec.serve, target=spec.build.target.value, out_dir=out, gpu_device_ids=spec.deploy.gpus
        )
    )
    return out


def parameters(config_pbtxt: Path) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    text_format.Parse(config_pbtxt.read_text(), config)
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.fixture
def cpu_artifacts(tmp_path):
    store = tmp_path / "artifacts" / "tiny-cpu"
    spec = load_spec("tiny-cpu")
    engine = tiny_engine(store / "build-b" / "engine")
    tokenizer_dir = tokenizer(store / "prepare-p")
    package = package_repository(spec, engine, tokenizer_dir, store / "package-k" / "model_repository")
    return spec, store, engine, tokenizer_dir, package


def test_write_deployment_writes_every_file(cpu_artifacts):
    spec, store, engine, tokenizer_dir, package = cpu_artifacts
    out = store / "deploy-d" / "deploy"
    deployment = write_deployment(spec, out, engine_dir=engine, tokenizer_dir=tokenizer_dir, package_repository=package, secrets=SECRETS)
    for name in (
        COMPOSE_FILE,
        ENV_FILE,
        layout.PROMETHEUS_CONFIG,
        layout.GRAFANA_DATASOURCES,
        layout.GRAFANA_DASHBOARD_PROVIDERS,
        layout.GRAFANA_DASHBOARD,
        layout.DOCKERFILE,
        layout.DOCKERIGNORE,
        "src/pyproject.toml",
        "src/refengine/__init__.py",
        "src/pipeline/deploy/image_setup.py",
    ):
        assert (out / name).is_file(), name
    assert not list((out / "src").rglob("__pycache__"))
    assert (out / COMPOSE_FILE).read_text() == render_text("tiny-cpu")
    assert stat.S_IMODE((out / ENV_FILE).stat().st_mode) == 0o600
    env = dict(line.split("=", 1) for line in (out / ENV_FILE).read_text().splitlines() if line and not line.startswith("#"))
    assert env == {"COMPOSE_PROJECT_NAME": "trtllm-tiny-cpu", "COMPOSE_PROFILES": "cpu", **SECRETS}
    assert lint_compose(yaml.safe_load((out / COMPOSE_FILE).read_text()), env=env) == []
    # links, relative, to the upstream artifacts; the container's repository names the mount points
    assert os.readlink(out / "engine") == "../../build-b/engine" and (out / "engine").resolve() == engine.resolve()
    assert (out / "tokenizer").resolve() == tokenizer_dir.resolve()
    assert parameters(out / "model_repository" / "tensorrt_llm" / "config.pbtxt")["engine_dir"] == "/engine"
    assert parameters(out / "model_repository" / "preprocessing" / "config.pbtxt")["tokenizer_dir"] == "/tokenizer"
    json.loads((out / layout.GRAFANA_DASHBOARD).read_text())
    for name in (layout.PROMETHEUS_CONFIG, layout.GRAFANA_DATASOURCES, layout.GRAFANA_DASHBOARD_PROVIDERS):
        assert yaml.safe_load((out / name).read_text())
    assert deployment.profile == "cpu" and (out / COMPOSE_FILE) in deployment.files


def test_generated_secrets_are_random_and_safe_for_the_flag(cpu_artifacts, tmp_path):
    spec, store, engine, tokenizer_dir, package = cpu_artifacts
    envs = []
    for index in range(2):
        out = tmp_path / f"d{index}"
        write_deployment(spec, out, engine_dir=engine, tokenizer_dir=tokenizer_dir)
        envs.append((out / ENV_FILE).read_text())
    assert envs[0] != envs[1]
    [generated] = parse_api_keys(read_env(tmp_path / "d0" / ENV_FILE)[layout.OPENAI_API_KEYS_VARIABLE], "generated")
    assert generated.name == "default" and len(generated.secret) == 32  # one key for the front end, named in its metrics
    for keys, says in (
        (f"ok:{'k' * 16},short-key", "line 1, entry 2: the key is shorter than 16 characters"),
        (f"{'k' * 16}\n{'j' * 16}", "must be one line: separate its keys with commas"),
    ):
        with pytest.raises(StageError, match=says) as refused:
            write_deployment(spec, tmp_path / "bad-keys", engine_dir=engine, tokenizer_dir=tokenizer_dir, secrets={"TRTLLM_PIPELINE_API_KEYS": keys})
        assert "short-key" not in str(refused.value) and "k" * 16 not in str(refused.value)
    with pytest.raises(StageError, match="at least 16 characters"):
        write_deployment(spec, tmp_path / "bad", engine_dir=engine, tokenizer_dir=tokenizer_dir, secrets={"TRITON_ADMIN_KEY": "a,b:c=d"})
    assert not (tmp_path / "bad").exists()


def test_container_repository_numbers_the_reserved_gpus_from_zero(tmp_path):
    spec = load_spec("llama-3.3-70b-fp8-tp2")
    spec = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"gpus": (2, 3)})})
    engine = llama_engine(tmp_path / "build" / "engine", tp_size=2)
    tokenizer_dir = tokenizer(tmp_path / "prepare")
    package = package_repository(spec, engine, tokenizer_dir, tmp_path / "package" / "model_repository")
    out = tmp_path / "deploy"
    deployment = write_deployment(spec, out, engine_dir=engine, tokenizer_dir=tokenizer_dir, package_repository=package, secrets=SECRETS)
    assert parameters(package / "tensorrt_llm" / "config.pbtxt")["gpu_device_ids"] == "2,3"  # host ids (serve on the host)
    container = parameters(out / "model_repository" / "tensorrt_llm" / "config.pbtxt")
    assert container["gpu_device_ids"] == "0,1" and container["gpt_model_path"] == "/engine"
    [device] = deployment.compose["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["2", "3"]
    # the OpenAI front end's image: the project on the Python base (NGC's Triton image runs the server)
    assert f"FROM {images.PYTHON_BASE_IMAGE}" in (out / layout.DOCKERFILE).read_text() and (out / "src" / "pyproject.toml").is_file()
    # the entrypoint's engine check, mounted at ENGINE_CHECK_MOUNT: a verbatim copy of the standalone module
    assert (out / layout.ENGINE_CHECK_FILE).read_text() == (REPO / "pipeline" / "backends" / "engine" / "runtime.py").read_text()


def test_a_repository_unlike_the_package_is_refused(cpu_artifacts, tmp_path):
    spec, store, engine, tokenizer_dir, package = cpu_artifacts
    (package / "extra_model").mkdir()
    (package / "extra_model" / "config.pbtxt").write_text("")
    with pytest.raises(StageError, match="only in the package: \\['extra_model/config.pbtxt'\\]"):
        write_deployment(spec, tmp_path / "d", engine_dir=engine, tokenizer_dir=tokenizer_dir, package_repository=package)


def test_the_stage_writes_the_deployment_with_links_relative_to_its_final_place(cpu_artifacts):
    spec, store, engine, tokenizer_dir, package = cpu_artifacts

    def ref(stage: str, path: Path) -> ArtifactRef:
        return ArtifactRef(stage, "0" * 16, path, {})

    out_dir, final_dir = store / ".tmp-deploy-d-1", store / "deploy-d"
    out_dir.mkdir()
    console = Console(file=io.StringIO(), width=200)
    ctx = deploy_stage.StageContext(
        spec=spec,
        model=None,
        plan=StagePlan("deploy", "d" * 16, {}, {}, {}, "deploy"),
        upstream={"prepare": ref("prepare", tokenizer_dir), "build": ref("build", engine.parent), "package": ref("package", package.parent)},
        out_dir=out_dir,
        console=console,
        final_dir=final_dir,
    )
    deploy_stage.run(ctx)
    out_dir.rename(final_dir)
    deploy_dir = final_dir / deploy_stage.DEPLOY_DIR
    assert (deploy_dir / "engine" / "config.json").is_file() and (deploy_dir / "tokenizer" / "tokenizer.json").is_file()
    assert ctx.notes["profile"] == "cpu" and ctx.notes["image_pinned_by_digest"] is True
    assert "docker compose --profile cpu up -d" in console.file.getvalue()


def test_export_makes_links_absolute_and_replaces_only_its_own_exports(cpu_artifacts, tmp_path):
    spec, store, engine, tokenizer_dir, package = cpu_artifacts
    source = store / "deploy-d" / "deploy"
    write_deployment(spec, source, engine_dir=engine, tokenizer_dir=tokenizer_dir, secrets=SECRETS)
    destination = tmp_path / "checkout" / "deploy"
    destination.parent.mkdir()
    export_deployment(source, destination)
    export_deployment(source, destination)  # again: replaces the earlier export
    assert Path(os.readlink(destination / "engine")).is_absolute()
    assert (destination / "engine").resolve() == engine.resolve()
    assert stat.S_IMODE((destination / ENV_FILE).stat().st_mode) == 0o600
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StageError, match="not written by trtllm-pipeline"):
        export_deployment(source, foreign)


# -- the checkout's docker-compose.yml ---------------------------------------------------------------
def test_root_compose_is_the_rendering_of_the_default_config():
    text = render_root_compose(load_spec("tiny-cpu"))
    check_golden(ROOT_COMPOSE, text)


def test_root_compose_names_only_the_stable_deploy_layout():
    document = yaml.safe_load(ROOT_COMPOSE.read_text())
    assert lint_compose(document, env=SECRETS) == []
    sources = [volume["source"] for service in document["services"].values() for volume in service["volumes"] if volume["type"] == "bind"]
    assert sources and all(source.startswith("./deploy/") for source in sources)
    assert document["services"]["triton"]["build"]["context"] == "./deploy"
    assert "artifacts/" not in " ".join(sources)


# -- up -----------------------------------------------------------------------------------------
def test_up_without_a_docker_engine_fails_with_a_hint(tmp_path, monkeypatch):
    (tmp_path / COMPOSE_FILE).write_text("services: {}\n")
    calls = []

    def no_daemon(command, **kwargs):
        calls.append(command)
        raise ToolError(command, 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock")

    monkeypatch.setattr("pipeline.deploy.compose.up.run_command", no_daemon)
    with pytest.raises(ToolError) as raised:
        compose_up(tmp_path, "cpu")
    assert "needs a running Docker engine" in raised.value.hint and f"cd {tmp_path} && docker compose --profile cpu up -d" in raised.value.hint
    assert calls == [["docker", "info", "--format", "{{.ServerVersion}}"]]


def test_up_runs_compose_with_the_profile(tmp_path, monkeypatch):
    (tmp_path / COMPOSE_FILE).write_text("services: {}\n")
    calls = []
    monkeypatch.setattr("pipeline.deploy.compose.up.run_command", lambda command, **kwargs: calls.append(command) or "ok")
    assert compose_up(tmp_path, "gpu") == "ok"
    assert calls[-1] == ["docker", "compose", "--project-directory", str(tmp_path), "-f", str(tmp_path / COMPOSE_FILE), "--profile", "gpu", "up", "-d"]
    with pytest.raises(StageError, match="holds no docker-compose.yml"):
        compose_up(tmp_path / "missing", "cpu")


def test_up_starts_the_chosen_services_with_override_files(tmp_path, monkeypatch):
    (tmp_path / COMPOSE_FILE).write_text("services: {triton: {}, openai: {}, prometheus: {}}\n")
    override = tmp_path / "override.yml"
    override.write_text("services: {}\n")
    calls = []
    monkeypatch.setattr("pipeline.deploy.compose.up.run_command", lambda command, **kwargs: calls.append(command) or "ok")
    compose_up(tmp_path, "cpu", services=["triton", "openai"], extra_files=[override])
    assert calls[-1] == [
        "docker",
        "compose",
        "--project-directory",
        str(tmp_path),
        "-f",
        str(tmp_path / COMPOSE_FILE),
        "-f",
        str(override),
        "--profile",
        "cpu",
        "up",
        "-d",
        "triton",
        "openai",
    ]


def test_up_refuses_an_unknown_service_or_a_missing_override_before_docker_runs(tmp_path, monkeypatch):
    (tmp_path / COMPOSE_FILE).write_text("services: {triton: {}, openai: {}}\n")
    calls = []
    monkeypatch.setattr("pipeline.deploy.compose.up.run_command", lambda command, **kwargs: calls.append(command) or "ok")
    with pytest.raises(SpecError, match=r"--service tritn: not a service of this deployment \(its services: openai, triton\)"):
        compose_up(tmp_path, "cpu", services=["tritn"])
    with pytest.raises(SpecError, match=r"--file .*nowhere.yml: no such compose file"):
        compose_up(tmp_path, "cpu", extra_files=[tmp_path / "nowhere.yml"])
    assert calls == []


def test_up_names_the_way_out_when_an_image_cannot_be_pulled(tmp_path, monkeypatch):
    (tmp_path / COMPOSE_FILE).write_text("services: {}\n")

    def offline(command, **kwargs):
        if "up" in command:
            raise ToolError(command, 1, "Error response from daemon: pull access denied for prom/prometheus, repository does not exist")
        return "ok"

    monkeypatch.setattr("pipeline.deploy.compose.up.run_command", offline)
    with pytest.raises(ToolError) as raised:
        compose_up(tmp_path, "cpu")
    assert "docker load -i image.tar" in raised.value.hint and "deploy.image" in raised.value.hint


# -- the real tritonserver accepts the cpu service's command ------------------------------------------
def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports (all held open while they are picked, so none is handed out twice)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _status(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> int:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # a hang guard: a loaded machine answers late
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.integration
def test_bundled_tritonserver_accepts_the_rendered_flags(tmp_path):
    """The cpu service's argv, run on this machine: restricted admin APIs answer 403 without the key."""
    from pipeline.deploy.image_setup import prepare
    from pipeline.serve.installation import server_environment

    prepare(tmp_path / "backends", tmp_path / "tritonserver")  # what the Dockerfile runs
    (tmp_path / "models").mkdir()
    ports = dict(zip((8000, 8001, 8002), _free_ports(3)))
    key = SECRETS["TRITON_ADMIN_KEY"]
    command = []
    for token in triton("tiny-cpu")["command"]:
        token = interpolate(token, SECRETS)
        token = token.replace(CPU_TRITONSERVER_ROOT, str(tmp_path / "tritonserver")).replace(CPU_BACKEND_DIR, str(tmp_path / "backends"))
        token = token.replace("=/models", f"={tmp_path / 'models'}")
        for container, host in ports.items():
            token = token.replace(f"-port={container}", f"-port={host}")
        command.append(token)
    command += ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_environment(), start_new_session=True)
    try:
        base = f"http://127.0.0.1:{ports[8000]}"
        deadline = time.monotonic() + 30
        while _status_or_none(f"{base}/v2/health/ready") != 200:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "tritonserver did not become ready"
            time.sleep(0.1)
        assert _status(f"{base}/v2/repository/index", method="POST") == 403
        assert _status(f"{base}/v2/repository/index", {"admin-key": key}, method="POST") == 200
        assert _status(f"{base}/v2/models/stats") == 403
        metrics = f"http://127.0.0.1:{ports[8002]}/metrics"
        while (status := _status_or_none(metrics)) != 200:  # the metrics service starts after the HTTP one
            assert time.monotonic() < deadline, f"metrics answered {status}; " + (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.1)
        probe = [part.replace(":8000/", f":{ports[8000]}/") for part in triton("tiny-cpu")["healthcheck"]["test"][1:]]
        assert subprocess.run([sys.executable if probe[0] == "python" else probe[0], *probe[1:]], timeout=10).returncode == 0
    finally:
        server.terminate()
        try:
            server.wait(EXIT_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _status_or_none(url: str) -> int | None:
    try:
        return _status(url)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _compose_binary() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1), whichever this machine has."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.skipif(_compose_binary() is None, reason="no docker compose binary on this machine (the schema checks above still run)")
@pytest.mark.parametrize("name", ["tiny-cpu", "llama-3.1-8b-fp8"])
def test_compose_itself_accepts_the_rendered_file_of_each_profile(name, tmp_path):
    (tmp_path / "docker-compose.yml").write_text(render_text(name))
    (tmp_path / ".env").write_text(f"{layout.ADMIN_KEY_VARIABLE}=k\n{layout.GRAFANA_PASSWORD_VARIABLE}=p\n{layout.OPENAI_API_KEYS_VARIABLE}=a\n")
    for path in ("model_repository", "engine", "tokenizer", "prometheus", "grafana"):
        (tmp_path / path).mkdir()
    result = subprocess.run([*_compose_binary(), "--project-directory", str(tmp_path), "config", "-q"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_deploy_refuses_service_or_file_without_up_before_building(tmp_path):
    from pipeline.cli import run_cli

    config = str(REPO / "build_configs" / "tiny-cpu.yaml")
    with pytest.raises(SpecError, match=r"--service and --file choose what `deploy --up` starts: add --up"):
        run_cli(["--artifacts", str(tmp_path / "store"), "deploy", config, "--out", str(tmp_path / "out"), "--service", "triton"], Console())
    assert not (tmp_path / "store" / "tiny-cpu").exists()  # nothing was built

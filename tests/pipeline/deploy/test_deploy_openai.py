"""The `openai` service of the docker compose deployment (cpu profile): what it runs, how it is wired
to Triton, and that its command reads the repository rendered for the container the way it is mounted.

The golden files and the Compose-schema / compose-config checks of the whole file are in test_deploy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clients.openai_server import ServedModel
from pipeline.cli import _parser
from pipeline.cli_openai import access_policy
from pipeline.deploy import layout
from pipeline.deploy.compose import COMPOSE_FILE, ENV_FILE, lint_compose, write_deployment
from pipeline.deploy.compose.checks import parse_port
from pipeline.deploy.compose.writer import read_env
from pipeline.deploy.server_command import openai_command
from tests.pipeline.deploy.test_deploy import SECRETS, load_spec, package_repository, render, tiny_engine, tokenizer


def test_the_cpu_deployment_has_the_openai_service_before_triton():
    services = render("tiny-cpu")["services"]
    assert list(services) == ["triton", "openai", "prometheus", "grafana"]
    openai, triton = services["openai"], services["triton"]
    assert (openai["image"], openai["build"], openai["profiles"]) == (triton["image"], triton["build"], ["cpu"])
    assert openai["depends_on"] == {"triton": {"condition": "service_healthy"}}
    command = openai["command"]
    assert command[:3] == ["trtllm-pipeline", "openai", "/models"]
    assert command[command.index("--triton-url") + 1] == "triton:8001" and command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--model-name") + 1] == "tiny-cpu"
    assert [parse_port(port)[:3] for port in openai["ports"]] == [("127.0.0.1", 9000, 9000)]
    assert any(":9000/health'" in part for part in openai["healthcheck"]["test"]) and openai["healthcheck"]["test"][0] == "CMD"
    # the API keys come from .env through the environment, never the command line (#36)
    assert openai["environment"]["TRTLLM_PIPELINE_API_KEYS"] == "${TRTLLM_PIPELINE_API_KEYS:?set TRTLLM_PIPELINE_API_KEYS in .env}"
    assert not any("KEYS" in part or "api-key" in part for part in command)
    assert openai["user"] == "1000:1000" and openai["read_only"] is True and openai["cap_drop"] == ["ALL"]
    assert {volume["target"]: volume["read_only"] for volume in openai["volumes"]} == {"/models": True, "/tokenizer": True}


@pytest.mark.parametrize("name", ["llama-3.1-8b-fp8", "llama-3.3-70b-fp8-tp2"])
def test_the_gpu_deployment_runs_it_from_the_project_image(name):
    services = render(name)["services"]
    assert list(services) == ["triton", "openai", "prometheus", "grafana"]
    openai, triton = services["openai"], services["triton"]
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:")  # NGC's image has no trtllm-pipeline
    assert openai["build"] == {"context": ".", "dockerfile": "Dockerfile"} and openai["pull_policy"] == "build"
    assert openai["image"] == f"trtllm-pipeline-cpu:{name}" and openai["profiles"] == ["gpu"] and "deploy" not in openai  # no GPU
    assert openai["depends_on"] == {"triton": {"condition": "service_healthy"}}


def test_the_port_follows_the_bind_address_and_a_clash_is_caught():
    spec = load_spec("tiny-cpu")
    spec = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"bind_address": "::1", "http_port": 9000})})
    from pipeline.deploy.compose import render_compose

    document = render_compose(spec, model_repository=Path("r"), engine_dir=None, tokenizer_dir=Path("t"), target="cpu")
    assert document["services"]["openai"]["ports"] == ["[::1]:9000:9000"]
    assert any("host port 9000 is also published" in problem for problem in lint_compose(document, env=SECRETS))


def test_the_command_parses_and_reads_the_container_repository(tmp_path, monkeypatch):
    spec = load_spec("tiny-cpu")
    store = tmp_path / "artifacts" / "tiny-cpu"
    engine = tiny_engine(store / "build-b" / "engine")
    tokenizer_dir = tokenizer(store / "prepare-p")
    package = package_repository(spec, engine, tokenizer_dir, store / "package-k" / "model_repository")
    out = tmp_path / "deploy"
    write_deployment(spec, out, engine_dir=engine, tokenizer_dir=tokenizer_dir, package_repository=package, secrets=SECRETS)
    compose = yaml.safe_load((out / COMPOSE_FILE).read_text())
    command = compose["services"]["openai"]["command"]
    assert command == openai_command(spec)
    args = _parser().parse_args(command[1:])
    # the front end calls the ensemble (pipeline.serve.front_end_route)
    assert (args.command, args.triton_url, args.port, args.triton_model) == ("openai", "triton:8001", 9000, "ensemble")
    # What the service reads in /models is the repository rendered for the container: it names the tokenizer mount.
    model = ServedModel.from_repository(out / layout.MODEL_REPOSITORY_DIR, name=args.model_name, triton_model=args.triton_model)
    assert model.tokenizer_dir == Path(layout.TOKENIZER_MOUNT) and (model.max_seq_len, model.max_input_len) == (1024, 768)
    assert (model.triton_model, model.llm_model) == ("ensemble", "tensorrt_llm")
    # With the environment compose gives it (.env interpolated), the command asks for the deployment's keys.
    monkeypatch.setenv(layout.OPENAI_API_KEYS_VARIABLE, read_env(out / ENV_FILE)[layout.OPENAI_API_KEYS_VARIABLE])
    assert access_policy(args).keys.names == ("ci", "key2")

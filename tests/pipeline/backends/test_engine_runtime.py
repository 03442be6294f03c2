"""An engine is refused where its recorded TensorRT-LLM version or GPU compute capability is not the
runtime's, with both values in the message (issue #6): the pure check, the probes with fake facts
(a fake `nvidia-smi`, a fake `tensorrt_llm` distribution), the container entrypoint script, the
compose wiring, and `serve` on the engine target."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.backends.engine import runtime as engine_runtime
from pipeline.backends.engine.runtime import (
    EngineRecord,
    EngineRuntimeMismatch,
    RuntimeFacts,
    check_engine_runtime,
    mismatches,
    parse_compute_capability,
    probe_compute_capabilities,
    probe_runtime,
)
from pipeline.backends.engine.target import (
    EngineMismatchError,
    check_before_serving,
    declared_engine,
    image_runtime,
    recorded_engine,
)
from pipeline.cli import main as cli_main
from pipeline.config.spec import Spec
from pipeline.deploy import layout
from pipeline.deploy.compose import render_compose
from pipeline.errors import SpecError
from pipeline.trtllm_versions import SUPPORTED_VERSIONS, version_for_image

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "pipeline" / "backends" / "engine" / "runtime.py"
H200_1_2_1 = EngineRecord("1.2.1", 90, "H200")


def load_spec(name: str) -> Spec:
    return Spec.model_validate(yaml.safe_load((REPO / "build_configs" / f"{name}.yaml").read_text()))


# -- the pure check ------------------------------------------------------------------------------
def test_matching_runtime_passes():
    check_engine_runtime(H200_1_2_1, RuntimeFacts("1.2.1", "installed tensorrt_llm package", (90, 90)))


def test_another_tensorrt_llm_version_is_refused_with_both_versions():
    with pytest.raises(EngineRuntimeMismatch) as raised:
        check_engine_runtime(H200_1_2_1, RuntimeFacts("1.1.0", "installed tensorrt_llm package", (90,)))
    message = str(raised.value)
    assert "built with TensorRT-LLM 1.2.1" in message and "this runtime has TensorRT-LLM 1.1.0 (installed tensorrt_llm package)" in message
    assert "compute capability" not in message


def test_another_gpu_architecture_is_refused_with_both_compute_capabilities():
    with pytest.raises(EngineRuntimeMismatch) as raised:
        check_engine_runtime(H200_1_2_1, RuntimeFacts("1.2.1", "", (80,)))
    message = str(raised.value)
    assert "built for GPU compute capability 9.0 (H200)" in message and "GPU has compute capability 8.0" in message
    assert "TensorRT-LLM 1.2.1," not in message


def test_both_mismatches_are_named_and_one_wrong_gpu_of_several_is_enough():
    problems = mismatches(H200_1_2_1, RuntimeFacts("1.0.0", "", (90, 89, 90)))
    assert len(problems) == 2
    assert "1.2.1" in problems[0] and "1.0.0" in problems[0]
    assert "9.0" in problems[1] and "8.9" in problems[1]


@pytest.mark.parametrize(
    ("engine", "runtime"),
    [
        (H200_1_2_1, RuntimeFacts()),  # nothing known about the runtime
        (EngineRecord("1.2.1"), RuntimeFacts("1.2.1", "", (80,))),  # no GPU recorded at build time
        (H200_1_2_1, RuntimeFacts(None, "", (90,))),  # no TensorRT-LLM found
        (H200_1_2_1, RuntimeFacts("v1.2.1+cu130", "", ())),  # the same release, spelled differently
    ],
)
def test_unknown_facts_are_not_checked(engine, runtime):
    assert mismatches(engine, runtime) == []


@pytest.mark.parametrize(("text", "sm"), [("9.0", 90), ("8.9", 89), ("10.0", 100), (" 12.0 ", 120), ("7.5", 75)])
def test_compute_capability_text(text, sm):
    assert parse_compute_capability(text) == sm
    assert engine_runtime.format_compute_capability(sm) == text.strip()


@pytest.mark.parametrize("text", ["", "9", "[N/A]", "9.0.1", "sm_90"])
def test_unreadable_compute_capability(text):
    with pytest.raises(ValueError):
        parse_compute_capability(text)


# -- probes, with fake facts --------------------------------------------------------------------------
def fake_smi(stdout: str, returncode: int = 0):
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, returncode, stdout=stdout, stderr="")

    return run, calls


def test_compute_capabilities_from_nvidia_smi():
    run, calls = fake_smi("0, 9.0\n1, 8.0\n")
    assert probe_compute_capabilities(which=lambda name: "/usr/bin/nvidia-smi", run=run) == (90, 80)
    assert calls == [["nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader"]]
    assert probe_compute_capabilities((1,), which=lambda name: "/x", run=run) == (80,)  # only the GPUs served on


@pytest.mark.parametrize(
    ("which", "stdout", "returncode"),
    [
        (lambda name: None, "", 0),  # no nvidia-smi: a CPU machine
        (lambda name: "/x", "", 9),  # a driver that fails the query (e.g. too old for compute_cap)
        (lambda name: "/x", "0, [N/A]\n", 0),  # an answer we cannot read
    ],
)
def test_compute_capabilities_unknown(which, stdout, returncode):
    run, _ = fake_smi(stdout, returncode)
    assert probe_compute_capabilities(which=which, run=run) == ()


def test_tensorrt_llm_version_from_the_installed_distribution(monkeypatch):
    def version(name):
        if name == "tensorrt_llm":
            return "1.1.0"
        raise engine_runtime.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(engine_runtime.importlib.metadata, "version", version)
    assert engine_runtime.probe_trtllm_version() == ("1.1.0", "installed tensorrt_llm package")


def test_no_tensorrt_llm_falls_back_to_what_the_caller_knows(monkeypatch):
    def absent(name):
        raise engine_runtime.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(engine_runtime.importlib.metadata, "version", absent)
    monkeypatch.setattr(engine_runtime.importlib.util, "find_spec", lambda name: None)
    assert engine_runtime.probe_trtllm_version() == (None, "")
    facts = probe_runtime(fallback_version="1.0.0", fallback_source="image tag", which=lambda name: None)
    assert facts == RuntimeFacts("1.0.0", "image tag", ())


def test_the_module_is_standalone():
    """The container runs a copy of it next to nothing of this project: standard library only."""
    tree = ast.parse(SCRIPT.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"tensorrt_llm"}  # imported only to ask its __version__


# -- the container entrypoint, run as a script with a fake nvidia-smi and a fake TensorRT-LLM -------------
@pytest.fixture
def fake_runtime(tmp_path):
    """(run(args, cc=..., trtllm=...) → CompletedProcess): the script in a fresh interpreter whose PATH has an
    nvidia-smi answering `cc` and whose sys.path has a tensorrt_llm distribution of version `trtllm`."""

    def run(args, *, cc=None, trtllm=None):
        root = tmp_path / f"runtime-{cc}-{trtllm}"
        bin_dir, site = root / "bin", root / "site"
        bin_dir.mkdir(parents=True)
        site.mkdir()
        if cc is not None:
            smi = bin_dir / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\necho '0, {cc}'\n")
            smi.chmod(0o755)
        if trtllm is not None:
            info = site / f"tensorrt_llm-{trtllm}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {trtllm}\n")
        env = {"PATH": str(bin_dir), "PYTHONPATH": str(site)}  # only the fakes: a real GPU host's facts stay out
        # -S: no site-packages (a TensorRT-LLM installed here would answer instead of the fake); stdlib suffices
        return subprocess.run([sys.executable, "-S", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)

    return run


ENTRY = ["--trtllm-version=1.2.1", "--compute-capability=9.0", "--gpu=H200", "--", sys.executable, "-c", "print('server started')"]


def test_entrypoint_execs_the_server_when_the_runtime_matches(fake_runtime):
    done = fake_runtime(ENTRY, cc="9.0", trtllm="1.2.1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "server started"


def test_entrypoint_refuses_another_gpu_and_names_both_values(fake_runtime):
    done = fake_runtime(ENTRY, cc="8.0", trtllm="1.2.1")
    assert done.returncode == engine_runtime.MISMATCH_EXIT_CODE
    assert "server started" not in done.stdout
    assert "refusing to start the server" in done.stderr
    assert "compute capability 9.0 (H200)" in done.stderr and "compute capability 8.0" in done.stderr


def test_entrypoint_refuses_another_tensorrt_llm_and_names_both_values(fake_runtime):
    done = fake_runtime(ENTRY, cc="9.0", trtllm="1.1.0")
    assert done.returncode == engine_runtime.MISMATCH_EXIT_CODE
    assert "TensorRT-LLM 1.2.1" in done.stderr and "TensorRT-LLM 1.1.0 (installed tensorrt_llm package)" in done.stderr


def test_entrypoint_starts_when_nothing_is_known(fake_runtime):
    done = fake_runtime(ENTRY)  # no nvidia-smi, no tensorrt_llm: nothing to compare
    assert done.returncode == 0 and done.stdout.strip() == "server started"


# -- what the build recorded, and the images' versions -------------------------------------------------
def test_recorded_engine_reads_the_engine_config_and_the_manifest(tmp_path):
    spec = load_spec("llama-3.1-8b-fp8")
    (tmp_path / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": {}, "build_config": {}}))
    assert recorded_engine(tmp_path, {"trtllm_version": "1.2.1", "gpu": "H200", "compute_capability": 90}, spec) == H200_1_2_1
    assert recorded_engine(tmp_path, {"gpu": "L40S"}, spec) == EngineRecord("1.2.1", 89, "L40S")  # older manifest: SM from the name
    (tmp_path / "config.json").write_text(json.dumps({"version": "1.1.0"}))  # the version that really built it wins
    assert recorded_engine(tmp_path, {"trtllm_version": "1.2.1"}, spec).trtllm_version == "1.1.0"


def test_declared_engine_is_the_specs_profile_and_gpu():
    spec = load_spec("llama-3.1-8b-fp8")
    assert declared_engine(spec) == H200_1_2_1
    no_gpu = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"gpu": None})})
    assert declared_engine(no_gpu) == EngineRecord("1.2.1", None, None)


def test_image_tags_map_to_their_profiles():
    for row in SUPPORTED_VERSIONS.values():
        assert version_for_image(row.image) is row
        assert version_for_image(f"{row.image}@sha256:{'0' * 64}") is row
        assert image_runtime(row.image).trtllm_version == row.version
    assert version_for_image("nvcr.io/nvidia/tritonserver:24.01-trtllm-python-py3") is None  # no profile recorded
    assert version_for_image("nvcr.io/nvidia/tritonserver:26.02-py3") is None  # no TensorRT-LLM in it
    assert image_runtime("registry.example/my-triton:1").trtllm_version is None


# -- wiring: compose, serve ---------------------------------------------------------------------------
def test_the_engine_container_checks_before_tritonserver_starts():
    spec = load_spec("llama-3.1-8b-fp8")
    service = render_compose(spec, model_repository=Path("r"), engine_dir=Path("e"), target="engine")["services"]["triton"]
    assert service["entrypoint"] == [
        "python3", layout.ENGINE_CHECK_MOUNT, "--trtllm-version=1.2.1", "--compute-capability=9.0", "--gpu=H200",
        "--", "/opt/nvidia/nvidia_entrypoint.sh",
    ]  # fmt: skip
    assert service["command"][0] == "tritonserver"  # what NGC's entrypoint runs once the check passed
    mounts = {volume["target"]: volume for volume in service["volumes"]}
    assert mounts[layout.ENGINE_CHECK_MOUNT] == {
        "type": "bind", "source": f"./{layout.ENGINE_CHECK_FILE}", "target": layout.ENGINE_CHECK_MOUNT, "read_only": True,
    }  # fmt: skip
    cpu = render_compose(load_spec("tiny-cpu"), model_repository=Path("r"), engine_dir=Path("e"), target="cpu")["services"]["triton"]
    assert "entrypoint" not in cpu


def test_a_deploy_image_of_another_tensorrt_llm_version_is_refused():
    spec = load_spec("llama-3.1-8b-fp8")
    old = SUPPORTED_VERSIONS["1.0.0"].image
    spec = spec.model_copy(update={"deploy": spec.deploy.model_copy(update={"image": old})})
    with pytest.raises(SpecError) as raised:
        render_compose(spec, model_repository=Path("r"), engine_dir=Path("e"), target="engine")
    assert "TensorRT-LLM 1.2.1" in raised.value.message and "TensorRT-LLM 1.0.0" in raised.value.message
    assert old in raised.value.message


def test_check_before_serving_with_fake_runtime_facts(tmp_path):
    spec = load_spec("llama-3.1-8b-fp8")
    assert check_before_serving(spec, None, {}, RuntimeFacts("1.2.1", "", (90,))) == H200_1_2_1
    with pytest.raises(EngineMismatchError) as raised:
        check_before_serving(spec, None, {}, RuntimeFacts("1.2.1", "", (89,)))
    assert raised.value.message.startswith("serve refuses this engine: ")
    (tmp_path / "config.json").write_text(json.dumps({"version": "1.2.1"}))
    with pytest.raises(EngineMismatchError, match=r"built with TensorRT-LLM 1\.2\.1, but this runtime has TensorRT-LLM 1\.1\.0"):
        check_before_serving(spec, tmp_path, {"gpu": "H200"}, RuntimeFacts("1.1.0", "", ()))


def test_serve_refuses_an_engine_for_another_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("pipeline.backends.engine.target.host_runtime", lambda spec: RuntimeFacts("1.2.1", "", (80,)))
    code = cli_main(["--artifacts", str(tmp_path), "serve", str(REPO / "build_configs" / "llama-3.1-8b-fp8.yaml")])
    err = capsys.readouterr().err
    assert code == EngineMismatchError.exit_code == 1
    assert "serve refuses this engine" in err and "compute capability 9.0 (H200)" in err and "compute capability 8.0" in err


def test_serve_of_a_matching_engine_target_still_says_where_it_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("pipeline.backends.engine.target.host_runtime", lambda spec: RuntimeFacts("1.2.1", "", (90,)))
    code = cli_main(["--artifacts", str(tmp_path), "serve", str(REPO / "build_configs" / "llama-3.1-8b-fp8.yaml")])
    assert code == 2 and "deploy it with docker compose on a GPU host" in capsys.readouterr().err

"""The artifact store at the command line's edge: the artifacts directory resolved once (relative paths
included), unusable directories refused with exit 2, and `verify` re-reading every artifact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.conftest import REPO

GPU_EXAMPLES = ["llama-3.1-8b-fp8.yaml", "llama-3.3-70b-fp8-tp2.yaml"]


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_the_gpu_examples_run_as_a_dry_run_with_the_default_relative_artifacts_directory(tmp_path, monkeypatch, capsys, example):
    monkeypatch.delenv("TRTLLM_PIPELINE_ARTIFACTS", raising=False)
    monkeypatch.chdir(tmp_path)  # the default is ./artifacts, relative
    assert main(["run", str(REPO / "build_configs" / example), "--runner", "dry-run", "--until", "build"]) == 0
    [script] = (tmp_path / "artifacts").glob("*/build-*/engine/trtllm-build.sh")
    text = script.read_text()
    assert f"--checkpoint_dir {tmp_path}/artifacts/" in text and f"--output_dir {tmp_path}/artifacts/" in text


@pytest.mark.parametrize(
    "artifacts, message",
    [("/etc/passwd", "--artifacts /etc/passwd: not a directory"), ("/etc/passwd/store", "--artifacts /etc/passwd/store: cannot create it")],
)
def test_an_unusable_artifacts_directory_is_a_usage_error_naming_it(capsys, artifacts, message):
    assert main(["--artifacts", artifacts, "run", str(REPO / "build_configs" / "tiny-cpu.yaml")]) == 2
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories; this case is only seen by other users")
def test_a_read_only_artifacts_directory_is_refused(tmp_path, capsys):
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    assert main(["--artifacts", str(read_only), "run", str(REPO / "build_configs" / "tiny-cpu.yaml")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_verify_rereads_every_artifact_and_names_what_differs(tmp_path, capsys):
    config = str(REPO / "build_configs" / "tiny-cpu.yaml")
    artifacts = str(tmp_path / "artifacts")
    assert main(["--artifacts", artifacts, "run", config, "--until", "build"]) == 0
    assert main(["--artifacts", artifacts, "verify", config]) == 0
    assert "read " in capsys.readouterr().out
    [weights] = Path(artifacts).glob("tiny-cpu/build-*/engine/rank0.safetensors")
    stat = weights.stat()
    with weights.open("r+b") as handle:
        handle.seek(stat.st_size // 2)
        handle.write(b"\0" * 64)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert main(["--artifacts", artifacts, "verify", config]) == 1
    err = capsys.readouterr().err
    assert "rank0.safetensors: SHA-256 differs" in err
    assert main(["--artifacts", artifacts, "status", config]) == 0
    assert "corrupt" in capsys.readouterr().out  # the hash cache saw the write, mtime put back or not


@pytest.mark.slow  # two full CLI runs at once: 24 s here
def test_two_runs_of_one_config_with_different_overrides_at_once_both_finish(tmp_path):
    import subprocess
    import sys

    config = str(REPO / "build_configs" / "tiny-cpu.yaml")
    command = [sys.executable, "-m", "pipeline", "--artifacts", str(tmp_path / "artifacts"), "run", config, "--until", "build"]
    runs = [
        subprocess.Popen([*command, "--set", f"build.max_seq_len={length}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for length in (900, 1000)
    ]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    builds = sorted((tmp_path / "artifacts" / "tiny-cpu").glob("build-*"))
    assert len(builds) == 2  # one engine per max_seq_len, the shared stages built once
    assert len(list((tmp_path / "artifacts" / "tiny-cpu").glob("prepare-*"))) == 1
    assert not list((tmp_path / "artifacts" / "tiny-cpu").glob(".tmp-*"))

"""The cpu image's build-time probe of the Python-backend stub (pipeline.deploy.image_setup.check_stub)."""

from __future__ import annotations

import sys

import pytest

from pipeline.deploy.image_setup import STUB_USAGE_STATUS, check_stub
from pipeline.errors import StageError


def _script(path, body: str):
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_stub_that_answers_its_usage_error_passes(tmp_path):
    check_stub(_script(tmp_path / "stub", f'echo "Expected 9 arguments, found 1 arguments." >&2; exit {STUB_USAGE_STATUS}'))


def test_a_stub_that_cannot_load_libpython_stops_the_build_with_the_loaders_message(tmp_path):
    """What a base image without libpython gives: the loader's exit 127, which Triton would answer with a chmod."""
    message = "stub: error while loading shared libraries: libpython3.11.so.1.0: cannot open shared object file"
    with pytest.raises(StageError) as caught:
        check_stub(_script(tmp_path / "stub", f'echo "{message}" >&2; exit 127'))
    assert "exited 127" in caught.value.message and message in caught.value.message
    assert "chmod" in caught.value.message
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"libpython{version}.so.1.0" in caught.value.hint and "deploy.image" in caught.value.hint


def test_a_stub_without_execute_permission_is_named(tmp_path):
    stub = tmp_path / "stub"
    stub.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(StageError, match="cannot be run"):
        check_stub(stub)


def test_the_bundled_stub_passes_the_probe_on_this_machine(tmp_path):
    """The real stub of the nvidia-pytriton wheel, linked as the image links it (the host has libpython)."""
    from pipeline.deploy.image_setup import prepare

    prepare(tmp_path / "backends", tmp_path / "tritonserver")


def test_the_image_build_step_prints_the_error_and_its_hint(tmp_path, monkeypatch, capsys):
    from pipeline.deploy import image_setup

    def refuse(backend_directory, link):
        raise StageError("the stub exited 127", hint="install libpython")

    monkeypatch.setattr(image_setup, "prepare", refuse)
    assert image_setup.main(["--backend-directory", str(tmp_path / "b"), "--link", str(tmp_path / "t")]) == 1
    assert capsys.readouterr().err == "error: the stub exited 127\nhint: install libpython\n"

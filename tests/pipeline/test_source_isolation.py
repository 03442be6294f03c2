"""The artifact store never writes through to the user's checkpoint: no hard links, no symlinks; by
default the weights stay in the source, recorded by content hash and re-checked when a stage reads
them; `model.copy_weights` copies them in instead."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.artifacts import ArtifactStore
from pipeline.config.loader import load_config
from pipeline.errors import StageError
from pipeline.runner import run_pipeline
from pipeline.stages.prepare import SOURCE_RECORD, checkpoint_dir
from tests.conftest import DEFAULT_MODEL, REPO

pytestmark = pytest.mark.slow


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _setup(tmp_path: Path, *overrides: str):
    source = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, source)
    text = (REPO / "build_configs" / "tiny-cpu.yaml").read_text().replace("../models/tiny-stdlib-llama", str(source))
    config = tmp_path / "tiny.yaml"
    config.write_text(text)
    loaded = load_config(config, overrides)
    return source, loaded, ArtifactStore(tmp_path / "artifacts", loaded.spec.name)


def test_writes_into_the_store_never_reach_the_source(tmp_path):
    source, loaded, store = _setup(tmp_path)
    before = _digests(source)
    results = {r.name: r for r in run_pipeline(loaded, store, until="quantize", console=Console(quiet=True))}
    prepared = results["prepare"].ref.path
    assert not list(prepared.glob("*.safetensors")) and (prepared / SOURCE_RECORD).is_file()  # recorded, not copied
    source_inodes = {(p.stat().st_dev, p.stat().st_ino) for p in source.iterdir()}
    for artifact in (prepared, results["quantize"].ref.path):
        for path in artifact.rglob("*"):
            assert not path.is_symlink()
            if path.is_file():
                assert (path.stat().st_dev, path.stat().st_ino) not in source_inodes
                with path.open("ab") as handle:  # what a careless user or tool might do
                    handle.write(b"garbage")
    assert _digests(source) == before


def test_a_source_changed_after_prepare_is_refused_by_the_stage_that_reads_it(tmp_path):
    source, loaded, store = _setup(tmp_path)
    results = {r.name: r for r in run_pipeline(loaded, store, until="prepare", console=Console(quiet=True))}
    prepared = results["prepare"].ref.path
    assert checkpoint_dir(prepared) == source
    weights = source / "model.safetensors"
    stat = weights.stat()
    with weights.open("r+b") as handle:  # truncated between validate and run
        handle.truncate(stat.st_size // 2)
    with pytest.raises(StageError, match="model.safetensors changed"):
        checkpoint_dir(prepared)
    weights.unlink()
    with pytest.raises(StageError, match="model.safetensors is gone"):
        checkpoint_dir(prepared)


def test_copy_weights_makes_a_self_contained_artifact(tmp_path):
    source, loaded, store = _setup(tmp_path, "model.copy_weights=true")
    results = {r.name: r for r in run_pipeline(loaded, store, until="prepare", console=Console(quiet=True))}
    prepared = results["prepare"].ref.path
    copied = prepared / "model.safetensors"
    assert copied.read_bytes() == (source / "model.safetensors").read_bytes()
    assert copied.stat().st_ino != (source / "model.safetensors").stat().st_ino and copied.stat().st_nlink == 1
    assert checkpoint_dir(prepared) == prepared
    shutil.rmtree(source)  # the artifact no longer needs it
    assert json.loads((prepared / "prepare.json").read_text())["num_parameters"] > 0
    assert os.path.getsize(copied) > 0


def test_a_model_directory_replaced_by_a_symlink_to_another_model_is_prepared_anew(tmp_path):
    source, loaded, store = _setup(tmp_path)
    first = {r.name: r for r in run_pipeline(loaded, store, until="prepare", console=Console(quiet=True))}["prepare"]
    other = tmp_path / "other-model"
    shutil.copytree(source, other)
    config = json.loads((other / "generation_config.json").read_text())
    (other / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.25}))
    shutil.rmtree(source)
    source.symlink_to(other, target_is_directory=True)
    again = load_config(tmp_path / "tiny.yaml")
    results = run_pipeline(again, ArtifactStore(tmp_path / "artifacts", again.spec.name), until="prepare", console=Console(quiet=True))
    second = {r.name: r for r in results}["prepare"]
    assert second.outcome == "built" and second.ref.path != first.ref.path
    assert checkpoint_dir(second.ref.path) == source


def test_an_artifact_deleted_while_it_is_verified_is_reported_not_a_crash(tmp_path, monkeypatch):
    import pipeline.artifacts as artifacts

    source, loaded, store = _setup(tmp_path)
    [result] = run_pipeline(loaded, store, until="prepare", console=Console(quiet=True))
    real = artifacts.differences

    def deleting(path, manifest, **options):
        shutil.rmtree(path)  # as another command's cleanup might, mid-verification
        return real(path, manifest, **options)

    monkeypatch.setattr(artifacts, "differences", deleting)
    from pipeline.runner import artifact_state, make_plan

    state = artifact_state(ArtifactStore(tmp_path / "artifacts", loaded.spec.name), make_plan(loaded).stage("prepare"))
    assert state.startswith("corrupt:"), state  # what `status` shows; never an internal error

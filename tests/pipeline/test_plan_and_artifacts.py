"""Plan digests (pure) and the artifact store (atomic writes, manifests, verification)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.artifacts import MANIFEST, ArtifactStore, read_manifest
from pipeline.config.loader import load_config
from pipeline.errors import ArtifactError
from pipeline.hashing import HashCache, file_hashes
from pipeline.plan import EnvFacts, plan
from tests.conftest import MINIMAL_CONFIG, write_model_config

FACTS = EnvFacts(tools={"torch": "2.13.0", "modelopt": "0.47.0", "trtllm_pipeline": "0.1.0"}, model_fingerprint="abc")

CONFIG = MINIMAL_CONFIG


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    write_model_config(tmp_path / "model")
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG)
    return path


def digests(config_path: Path, *overrides: str, facts: EnvFacts = FACTS) -> dict[str, str]:
    spec = load_config(config_path, overrides).spec
    return {stage.name: stage.digest for stage in plan(spec, facts).stages}


def test_plan_is_deterministic_and_ordered(config_path: Path) -> None:
    first = digests(config_path)
    assert list(first) == ["prepare", "quantize", "build", "package", "deploy"]
    assert first == digests(config_path)
    assert len(set(first.values())) == 5


def test_a_build_field_changes_build_and_downstream_only(config_path: Path) -> None:
    base = digests(config_path)
    changed = digests(config_path, "build.max_seq_len=1000")
    assert changed["prepare"] == base["prepare"] and changed["quantize"] == base["quantize"]
    assert changed["build"] != base["build"] and changed["package"] != base["package"]


def test_a_quantize_field_changes_quantize_and_downstream(config_path: Path) -> None:
    base = digests(config_path)
    changed = digests(config_path, "quantize.calibration.seed=7")
    assert changed["prepare"] == base["prepare"]
    assert changed["quantize"] != base["quantize"] and changed["build"] != base["build"]


def test_tp_size_is_part_of_the_checkpoint(config_path: Path) -> None:
    base = digests(config_path)
    changed = digests(config_path, "build.tp_size=2")
    assert changed["quantize"] != base["quantize"]


def test_serve_fields_change_package_and_deploy_fields_only_deploy(config_path: Path) -> None:
    base = digests(config_path)
    changed = digests(config_path, "serve.max_queue_size=5")
    assert {name for name in base if base[name] != changed[name]} == {"package", "deploy"}
    changed = digests(config_path, "deploy.http_port=9100")
    assert {name for name in base if base[name] != changed[name]} == {"deploy"}


def test_model_content_and_tool_versions_change_digests(config_path: Path) -> None:
    base = digests(config_path)
    other_model = digests(config_path, facts=EnvFacts(FACTS.tools, "def"))
    assert all(other_model[name] != base[name] for name in base)
    newer_modelopt = digests(config_path, facts=EnvFacts({**FACTS.tools, "modelopt": "0.48.0"}, "abc"))
    assert newer_modelopt["prepare"] == base["prepare"] and newer_modelopt["quantize"] != base["quantize"]


def test_moving_the_model_directory_keeps_digests(tmp_path: Path, config_path: Path) -> None:
    base = digests(config_path)
    (tmp_path / "model").rename(tmp_path / "elsewhere")
    assert digests(config_path, "model.source=elsewhere") == base


def _stage(config_path: Path, name: str = "prepare"):
    return plan(load_config(config_path).spec, FACTS).stage(name)


def test_store_writes_atomically_with_manifest(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    assert store.lookup(stage) is None
    with store.create(stage, build_name="demo") as out:
        assert out.name.startswith(".tmp-")
        (out / "sub").mkdir()
        (out / "sub" / "a.txt").write_text("hello")
        assert store.lookup(stage) is None  # not visible until sealed
    ref = store.lookup(stage)
    assert ref is not None and ref.path == store.path_for(stage)
    manifest = read_manifest(ref.path)
    assert manifest["stage"] == "prepare" and manifest["digest"] == stage.digest
    assert manifest["files"]["sub/a.txt"]["sha256"] == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert set(manifest) >= {"inputs", "upstream", "tools", "created", "duration_s"}
    assert [p.name for p in store.build_dir.iterdir() if p.name.startswith(".tmp-")] == []


def test_failed_stage_leaves_nothing(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    with pytest.raises(RuntimeError):
        with store.create(stage, build_name="demo") as out:
            (out / "half.bin").write_bytes(b"x" * 10)
            raise RuntimeError("boom")
    assert store.lookup(stage) is None
    assert [p.name for p in store.build_dir.iterdir() if p.name != ".lock"] == []


def test_verification_detects_tampering(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    with store.create(stage, build_name="demo") as out:
        (out / "w.bin").write_bytes(b"abcd")
    path = store.path_for(stage)
    (path / "w.bin").write_bytes(b"abce")  # same size, new mtime → re-hashed
    with pytest.raises(ArtifactError, match="SHA-256 differs"):
        ArtifactStore(tmp_path / "artifacts", "demo").lookup(stage)  # a new command (one verification per store)
    (path / "w.bin").write_bytes(b"abc")
    with pytest.raises(ArtifactError, match="size 3 differs"):
        ArtifactStore(tmp_path / "artifacts", "demo").lookup(stage)
    (path / "w.bin").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        ArtifactStore(tmp_path / "artifacts", "demo").lookup(stage)


def test_a_write_that_puts_the_mtime_back_is_still_detected(tmp_path: Path, config_path: Path) -> None:
    """Silent rot as `cp -p`, `rsync -t` or a restored backup leave it: same size, same mtime, new
    content. The ctime (which utime cannot set back) sends the file to be re-hashed."""
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    with store.create(stage, build_name="demo") as out:
        (out / "rank0.safetensors").write_bytes(os.urandom(4 << 20))
    weights = store.path_for(stage) / "rank0.safetensors"
    before = weights.stat()
    with weights.open("r+b") as handle:  # corrupt 2 MB in place
        handle.seek(1 << 20)
        handle.write(os.urandom(2 << 20))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns and weights.stat().st_size == before.st_size
    with pytest.raises(ArtifactError, match="rank0.safetensors: SHA-256 differs"):
        ArtifactStore(tmp_path / "artifacts", "demo").lookup(stage)


def test_an_unchanged_artifact_is_not_read_again_and_verify_fully_reads_it_all(tmp_path: Path, config_path: Path) -> None:
    hashes = file_hashes()
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    with store.create(stage, build_name="demo") as out:
        (out / "big.bin").write_bytes(b"x" * (3 << 20))
    read = hashes.hashed_bytes
    ref = ArtifactStore(tmp_path / "artifacts", "demo").lookup(stage)  # as the next command would
    assert ref is not None and hashes.hashed_bytes == read  # stat only
    store.verify_fully(ref)
    assert hashes.hashed_bytes == read + (3 << 20)


def test_the_hash_cache_survives_the_process_and_refuses_a_changed_file(tmp_path: Path) -> None:
    location = tmp_path / "cache" / "hashes.json"
    target = tmp_path / "file.bin"
    target.write_bytes(b"a" * 1000)
    first = HashCache(location)
    digest = first.sha256(target)
    first.save()
    second = HashCache(location)  # a later command
    assert second.sha256(target) == digest and second.hashed_bytes == 0
    stat = target.stat()
    target.write_bytes(b"b" * 1000)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert HashCache(location).sha256(target) != digest
    assert HashCache(None).sha256(target) == HashCache(None).rehash(target)  # no cache: always read


def test_rebuild_replaces_existing_artifact(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stage = _stage(config_path)
    for content in (b"one", b"two!"):
        with store.create(stage, build_name="demo") as out:
            (out / "w.bin").write_bytes(content)
    ref = store.lookup(stage)
    assert ref is not None and (ref.path / "w.bin").read_bytes() == b"two!"
    assert sorted(p.name for p in store.build_dir.iterdir()) == [stage.dirname]


def test_stage_may_not_write_its_own_manifest(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    with pytest.raises(ArtifactError, match="reserved"):
        with store.create(_stage(config_path), build_name="demo") as out:
            (out / MANIFEST).write_text(json.dumps({}))


def test_stale_temporaries_are_removed(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    stale = store.build_dir / ".tmp-quantize-0123-999999"
    stale.mkdir(parents=True)
    (stale / "rank0.safetensors").write_bytes(os.urandom(16))
    with store.lock():
        assert store.remove_stale_temporaries() == [stale]
    assert not stale.exists()


def test_absent_lora_and_speculative_sections_leave_the_digest_inputs_alone(config_path: Path) -> None:
    spec = load_config(config_path).spec
    stages = {stage.name: stage for stage in plan(spec, FACTS).stages}
    assert "lora" not in stages["build"].inputs["build"] and "speculative" not in stages["build"].inputs["build"]
    assert "lora" not in stages["package"].inputs["serve"] and "speculative" not in stages["package"].inputs


def test_lora_adapters_enter_the_build_digest_by_content(tmp_path: Path) -> None:
    from pipeline.runner import gather_facts

    write_model_config(tmp_path / "model")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}')
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG.replace("target: cpu", "target: engine") + "  lora:\n    adapter_dirs: [adapter]\n  speculative:\n    mode: lookahead_decoding\n")
    loaded = load_config(path)
    facts = gather_facts(loaded)
    first = {stage.name: stage for stage in plan(loaded.spec, facts).stages}
    assert first["build"].inputs["build"]["lora"]["adapter_dirs"] == facts.lora_fingerprint != ""
    assert first["package"].inputs["speculative"]["mode"] == "lookahead_decoding"  # Triton's lookahead parameters come from it
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    second = {stage.name: stage for stage in plan(loaded.spec, gather_facts(loaded)).stages}
    assert second["build"].digest != first["build"].digest and second["quantize"].digest == first["quantize"].digest


def test_concurrent_commands_keep_each_others_hashes(tmp_path: Path) -> None:
    location = tmp_path / "hashes.json"
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(b"1" * 100)
    two.write_bytes(b"2" * 100)
    first, second = HashCache(location), HashCache(location)  # two commands started together
    first.sha256(one)
    second.sha256(two)
    first.save()
    second.save()  # merges: the first command's entry stays
    later = HashCache(location)
    later.sha256(one)
    later.sha256(two)
    assert later.hashed_bytes == 0


def test_history_lists_a_stages_verified_artifacts_of_every_digest_oldest_first(tmp_path: Path, config_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts", "demo")
    spec = load_config(config_path).spec
    stages = [plan(spec, EnvFacts(tools={}, model_fingerprint=f"m{i}")).stage("build") for i in range(3)]
    for stage, created in zip(stages, ("2026-01-03T00:00:00Z", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")):
        with store.create(stage, build_name="demo") as out:
            (out / "engine.txt").write_text(stage.digest)
        manifest = read_manifest(store.path_for(stage))
        (store.path_for(stage) / MANIFEST).write_text(json.dumps({**manifest, "created": created}))
    with store.create(_stage(config_path, "prepare"), build_name="demo") as out:
        (out / "prepare.json").write_text("{}")
    (store.build_dir / f".tmp-{stages[0].dirname}-1").mkdir()  # an interrupted run's
    assert [ref.digest for ref in ArtifactStore(store.root, "demo").history("build")] == [stages[1].digest, stages[2].digest, stages[0].digest]
    (store.path_for(stages[2]) / "engine.txt").write_text("changed")
    history = ArtifactStore(store.root, "demo").history("build")
    assert [ref.digest for ref in history] == [stages[1].digest, stages[0].digest]  # a changed artifact is left out
    assert history[0].manifest["created"] == "2026-01-01T00:00:00Z" and history[0].stage == "build"
    assert ArtifactStore(store.root, "other").history("build") == ()

"""Content-addressed artifact store: `<root>/<build>/<stage>-<digest>/{manifest.json, payload…}`.

A stage writes into a private temporary directory; only a complete result, with its manifest, is
renamed into place. A killed run therefore leaves at most a temporary directory, which the next
run removes. Reuse verifies every file against the manifest: its size, and its SHA-256 through the
hash cache (pipeline/hashing.py: re-read whenever the file's inode, size, mtime or ctime changed, so a
write is noticed even when the mtime is put back); `verify(..., full=True)` re-reads every file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.errors import ArtifactError, StoreLocationError
from pipeline.hashing import file_hashes, list_files
from pipeline.plan import StagePlan

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_TMP_PREFIX = ".tmp-"

# Where each stage puts its payload inside its artifact directory. The stages write there and everyone downstream
# reads through ArtifactRef's accessors below, so a name is stated once.
CHECKPOINT_DIR = "trtllm_checkpoint"  # quantize (and draft): the TensorRT-LLM checkpoint
UNIFIED_HF_DIR = "hf_checkpoint"  # quantize: ModelOpt's unified Hugging Face checkpoint, for the llmapi target
ENGINE_DIR = "engine"  # build (and draft): the engine directory
REPOSITORY_DIR = "model_repository"  # package: the Triton model repository
DEPLOY_DIR = "deploy"  # deploy: the deployment directory


@dataclass(frozen=True)
class ArtifactRef:
    """A finished, verified artifact, handed to the stages downstream of it."""

    stage: str
    digest: str
    path: Path
    manifest: dict[str, Any]

    @property
    def checkpoint_dir(self) -> Path:
        """The TensorRT-LLM checkpoint of a quantize or draft artifact."""
        return self.path / CHECKPOINT_DIR

    @property
    def unified_hf_dir(self) -> Path:
        """ModelOpt's unified Hugging Face checkpoint of a quantize artifact (llmapi target)."""
        return self.path / UNIFIED_HF_DIR

    @property
    def engine_dir(self) -> Path:
        """The engine directory of a build or draft artifact."""
        return self.path / ENGINE_DIR

    @property
    def repository_dir(self) -> Path:
        """The Triton model repository of a package artifact."""
        return self.path / REPOSITORY_DIR

    @property
    def deploy_dir(self) -> Path:
        """The deployment directory of a deploy artifact."""
        return self.path / DEPLOY_DIR


class ArtifactStore:
    def __init__(self, root: Path, build_name: str) -> None:
        self.root = root
        self.build_dir = root / build_name
        self._verified: dict[Path, ArtifactRef] = {}  # once per command: lookups after the first reuse it

    def path_for(self, stage: StagePlan) -> Path:
        return self.build_dir / stage.dirname

    def lookup(self, stage: StagePlan) -> ArtifactRef | None:
        """The artifact for `stage` if it exists and verifies; None if absent. Raises ArtifactError if corrupt.
        Verified once per store object (per command); `verify_fully` re-reads every file."""
        path = self.path_for(stage)
        if path not in self._verified and not path.is_dir():
            return None
        return self._verified_ref(path, stage.name, stage.digest)

    def history(self, stage: str) -> tuple[ArtifactRef, ...]:
        """Every sealed artifact of `stage` in this build, whatever its digest, oldest first (by the manifest's
        `created`). Only artifacts that verify are listed: an unreadable or changed one is left out."""
        refs = []
        for path in sorted(self.build_dir.glob(f"{stage}-*")):
            digest = path.name.removeprefix(f"{stage}-")
            if "-" in digest or not path.is_dir():  # another stage's name that starts alike
                continue
            try:
                refs.append(self._verified_ref(path, stage, digest))
            except ArtifactError:
                continue
        return tuple(sorted(refs, key=lambda ref: str(ref.manifest.get("created", ""))))

    def _verified_ref(self, path: Path, stage: str, digest: str) -> ArtifactRef:
        if path not in self._verified:
            manifest = read_manifest(path)
            verify(path, manifest)
            self._verified[path] = ArtifactRef(stage, digest, path, manifest)
        return self._verified[path]

    def verify_fully(self, ref: ArtifactRef) -> None:
        """Re-read every file of a found artifact and compare it with the manifest (ArtifactError if not)."""
        verify(ref.path, ref.manifest, full=True)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One writer per build at a time (a second `run` of the same config waits)."""
        self.build_dir.mkdir(parents=True, exist_ok=True)
        with open(self.build_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete temporary directories left by killed runs. Call only while holding `lock()`."""
        removed = []
        if self.build_dir.is_dir():
            for entry in self.build_dir.iterdir():
                if entry.name.startswith(_TMP_PREFIX) and entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    @contextlib.contextmanager
    def create(self, stage: StagePlan, *, build_name: str, notes: dict[str, Any] | None = None) -> Iterator[Path]:
        """Yield an empty private directory; on normal exit, seal it with a manifest and move it into place.

        `notes` may be filled by the stage while it runs; it is stored in the manifest (e.g. the
        calibration set's fingerprint, or a gate's verdict)."""
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self._verified.pop(self.path_for(stage), None)
        tmp = self.build_dir / f"{_TMP_PREFIX}{stage.dirname}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        started = time.monotonic()
        try:
            yield tmp
            if (tmp / MANIFEST).exists():
                raise ArtifactError(f"stage {stage.name} wrote its own {MANIFEST}; that name is reserved")
            manifest = {
                "format": MANIFEST_FORMAT,
                "build": build_name,
                "stage": stage.name,
                "digest": stage.digest,
                "inputs": stage.inputs,
                "upstream": stage.upstream,
                "tools": stage.tools,
                # microseconds: history() orders by this, and a cached rerun can seal within the same second
                "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "duration_s": round(time.monotonic() - started, 3),
                "files": _describe_files(tmp),
                "notes": notes if notes is not None else {},
            }
            _write_json_durably(tmp / MANIFEST, manifest)
            _fsync_dir(tmp)
            final = self.path_for(stage)
            if final.exists():  # --force: replace the old artifact in one rename, then drop it
                trash = self.build_dir / f"{_TMP_PREFIX}old-{stage.dirname}-{os.getpid()}"
                final.rename(trash)
                tmp.rename(final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                tmp.rename(final)
            _fsync_dir(self.build_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def store_root(path: Path, *, writable: bool) -> Path:
    """The artifacts directory as an absolute path, resolved once at the edge (relative paths would
    reach trtllm-build, docker mounts and dry-run scripts as they are), or StoreLocationError saying
    what is wrong with it. `writable`: the command writes artifacts there (created when the first one
    is written, so a command refused before that leaves nothing behind)."""
    root = Path(os.path.abspath(path))
    if root.exists() and not root.is_dir():
        raise StoreLocationError(f"--artifacts {path}: not a directory")
    if not writable:
        return root
    existing = root
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise StoreLocationError(f"--artifacts {path}: cannot create it ({existing} is not a directory)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoreLocationError(f"--artifacts {path}: not writable by this user ({existing})")
    return root


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable {MANIFEST} ({exc})") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"{path}/{MANIFEST}: unknown manifest format")
    return manifest


def verify(path: Path, manifest: dict[str, Any], *, full: bool = False) -> None:
    """Check that `path` holds exactly the manifest's files with the recorded contents (`full`: read
    every file again rather than trust the hash cache). ArtifactError naming the first difference."""
    found = differences(path, manifest, full=full, first_only=True)
    if found:
        raise ArtifactError(found[0])


def differences(path: Path, manifest: dict[str, Any], *, full: bool = False, first_only: bool = False) -> list[str]:
    """What differs between `path` and its manifest: files missing or unexpected, sizes, SHA-256s."""
    recorded: dict[str, dict[str, Any]] = manifest["files"]
    present = {rel.as_posix() for rel in list_files(path)} - {MANIFEST}
    missing = sorted(set(recorded) - present)
    extra = sorted(present - set(recorded))
    if missing or extra:
        problems = [f"{path}: files differ from the manifest (missing: {missing or 'none'}, unexpected: {extra or 'none'})"]
        if first_only:
            return problems
    else:
        problems = []
    hashes = file_hashes()
    for rel, entry in recorded.items():
        if rel in missing:
            continue
        try:
            size = (path / rel).stat().st_size
            if size != entry["size"]:
                problems.append(f"{path / rel}: size {size} differs from the manifest's {entry['size']}")
            elif (hashes.rehash(path / rel) if full else hashes.sha256(path / rel)) != entry["sha256"]:
                problems.append(f"{path / rel}: SHA-256 differs from the manifest (the file was changed after it was written)")
        except FileNotFoundError:  # deleted while it was being read (e.g. by another command)
            problems.append(f"{path / rel}: vanished while it was verified")
        if problems and first_only:
            return problems
    return problems


def annotate_manifest(path: Path, key: str, value: dict[str, Any]) -> None:
    """Merge `value` into `manifest[key]` of a sealed artifact (atomically). The manifest is not part of
    the verified payload, so a later verdict (e.g. a failed gate) can be recorded next to the files."""
    manifest = read_manifest(path)
    manifest.setdefault(key, {}).update(value)
    tmp = path / f".{MANIFEST}.tmp"
    _write_json_durably(tmp, manifest)
    os.replace(tmp, path / MANIFEST)


def _describe_files(root: Path) -> dict[str, dict[str, Any]]:
    hashes = file_hashes()
    files = {}
    for rel in list_files(root):
        stat = (root / rel).stat()
        files[rel.as_posix()] = {"sha256": hashes.sha256(root / rel), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return files


def _write_json_durably(path: Path, value: Any) -> None:
    with path.open("w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

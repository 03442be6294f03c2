"""Content-addressed artifact store: `<root>/<build>/<stage>-<digest>/{manifest.json, payload…}`.

A stage writes into a private temporary directory; only a complete result, with its manifest, is
renamed into place. A killed run therefore leaves at most a temporary directory, which the next
run removes. Reuse verifies every file against the manifest (size and modification time; SHA-256
whenever those differ).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import ArtifactError
from pipeline.hashing import list_files, sha256_file
from pipeline.plan import StagePlan

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class ArtifactRef:
    """A finished, verified artifact, handed to the stages downstream of it."""

    stage: str
    digest: str
    path: Path
    manifest: dict[str, Any]


class ArtifactStore:
    def __init__(self, root: Path, build_name: str) -> None:
        self.root = root
        self.build_dir = root / build_name

    def path_for(self, stage: StagePlan) -> Path:
        return self.build_dir / stage.dirname

    def lookup(self, stage: StagePlan) -> ArtifactRef | None:
        """The artifact for `stage` if it exists and verifies; None if absent. Raises ArtifactError if corrupt."""
        path = self.path_for(stage)
        if not path.is_dir():
            return None
        manifest = read_manifest(path)
        verify(path, manifest)
        return ArtifactRef(stage.name, stage.digest, path, manifest)

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
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
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


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable {MANIFEST} ({exc})") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"{path}/{MANIFEST}: unknown manifest format")
    return manifest


def verify(path: Path, manifest: dict[str, Any]) -> None:
    """Check that `path` holds exactly the manifest's files with the recorded contents."""
    recorded: dict[str, dict[str, Any]] = manifest["files"]
    present = {rel.as_posix() for rel in list_files(path)} - {MANIFEST}
    missing = sorted(set(recorded) - present)
    extra = sorted(present - set(recorded))
    if missing or extra:
        raise ArtifactError(f"{path}: files differ from the manifest (missing: {missing or 'none'}, unexpected: {extra or 'none'})")
    for rel, entry in recorded.items():
        stat = (path / rel).stat()
        if stat.st_size != entry["size"]:
            raise ArtifactError(f"{path / rel}: size {stat.st_size} differs from the manifest's {entry['size']}")
        if stat.st_mtime_ns != entry.get("mtime_ns") and sha256_file(path / rel) != entry["sha256"]:
            raise ArtifactError(f"{path / rel}: SHA-256 differs from the manifest")


def annotate_manifest(path: Path, key: str, value: dict[str, Any]) -> None:
    """Merge `value` into `manifest[key]` of a sealed artifact (atomically). The manifest is not part of
    the verified payload, so a later verdict (e.g. a failed gate) can be recorded next to the files."""
    manifest = read_manifest(path)
    manifest.setdefault(key, {}).update(value)
    tmp = path / f".{MANIFEST}.tmp"
    _write_json_durably(tmp, manifest)
    os.replace(tmp, path / MANIFEST)


def _describe_files(root: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for rel in list_files(root):
        stat = (root / rel).stat()
        files[rel.as_posix()] = {"sha256": sha256_file(root / rel), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
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


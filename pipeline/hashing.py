"""File hashing for manifests and input fingerprints."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(root: Path) -> list[Path]:
    """Every regular file under `root`, sorted, relative to it (symlinks followed)."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def directory_fingerprint(root: Path, *, skip_suffixes: tuple[str, ...] = ()) -> str:
    """A digest of the names and contents of the files in `root` (not its path or timestamps)."""
    digest = hashlib.sha256()
    for rel in list_files(root):
        if rel.name.startswith(".") or rel.suffix in skip_suffixes:
            continue
        digest.update(f"{rel.as_posix()}\0{sha256_file(root / rel)}\n".encode())
    return digest.hexdigest()[:32]

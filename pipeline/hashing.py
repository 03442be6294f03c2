"""File hashing for manifests and input fingerprints, with a content-hash cache keyed by what the OS
says about a file.

A file's SHA-256 is reused while its device, inode, size, mtime_ns and ctime_ns are unchanged, so an
unchanged 140 GB checkpoint is not re-read by every command. Any write to a file changes its ctime,
and so does restoring its mtime afterwards (`utime`, `cp -p`, `rsync -t`, a restored backup cannot set
ctime back), so a modified file is always re-hashed; a file replaced by another (rename, new inode)
has another key. What the cache cannot see: a change below the file system (bit rot on the disk, a
write to the raw device); `trtllm-pipeline verify` re-reads everything for that.

The cache is one JSON file (default `$XDG_CACHE_HOME/trtllm-pipeline/file-hashes.json`, else
`~/.cache/...`; `TRTLLM_PIPELINE_HASH_CACHE` names another, `off` disables it), read once per
process; what a process learned is merged into it under a lock and written back atomically, so
concurrent commands do not drop each other's entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path

_CHUNK = 1 << 20
_MAX_ENTRIES = 200_000
CACHE_ENV = "TRTLLM_PIPELINE_HASH_CACHE"


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's content, read in full."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashCache:
    def __init__(self, location: Path | None) -> None:
        self.location = location
        self._entries: dict[str, list] | None = None
        self._learned: dict[str, list] = {}  # hashed by this process, not yet saved
        self.hashed_bytes = 0  # read in full by this process (what the cache did not save)

    def sha256(self, path: Path) -> str:
        """The file's SHA-256: from the cache while its (device, inode, size, mtime, ctime) are the
        ones it was hashed with, else read in full (and remembered)."""
        stat = os.stat(path)
        key, facts = _key(stat)
        entries = self._load()
        cached = entries.get(key)
        if cached is not None and cached[:3] == facts:
            return cached[3]
        return self._hash(path, key, facts)

    def rehash(self, path: Path) -> str:
        """Read the file in full whatever the cache says (and remember the result)."""
        key, facts = _key(os.stat(path))
        return self._hash(path, key, facts)

    def save(self) -> None:
        if not self._learned or self.location is None:
            return
        try:
            self.location.parent.mkdir(parents=True, exist_ok=True)
            with open(self.location.with_name(self.location.name + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                entries = {**self._read(), **self._learned}  # what others saved meanwhile stays
                if len(entries) > _MAX_ENTRIES:  # keep the newest half (dicts keep insertion order)
                    entries = dict(list(entries.items())[-_MAX_ENTRIES // 2 :])
                with tempfile.NamedTemporaryFile("w", dir=self.location.parent, prefix=".hashes-", delete=False) as handle:
                    json.dump(entries, handle, separators=(",", ":"))
                os.replace(handle.name, self.location)
            self._learned = {}
        except OSError:
            pass  # a read-only home costs re-hashing next time, nothing else

    def _hash(self, path: Path, key: str, facts: list) -> str:
        value = sha256_file(path)
        self.hashed_bytes += facts[0]
        after_key, after_facts = _key(os.stat(path))
        if (after_key, after_facts) == (key, facts):  # not written to while it was read
            self._load()[key] = self._learned[key] = [*facts, value]
        return value

    def _load(self) -> dict[str, list]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, list]:
        if self.location is None:
            return {}
        try:
            loaded = json.loads(self.location.read_text())
        except (OSError, ValueError):
            return {}  # no cache yet, or an unreadable one: start afresh
        return loaded if isinstance(loaded, dict) else {}


def _key(stat: os.stat_result) -> tuple[str, list]:
    return f"{stat.st_dev}:{stat.st_ino}", [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def default_cache_location() -> Path | None:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return None if configured.lower() == "off" else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtllm-pipeline" / "file-hashes.json"


_process_cache: HashCache | None = None


def file_hashes() -> HashCache:
    """The process's hash cache (saved when the process exits normally, and by `save`)."""
    global _process_cache
    if _process_cache is None:
        import atexit

        _process_cache = HashCache(default_cache_location())
        atexit.register(_process_cache.save)
    return _process_cache


def list_files(root: Path) -> list[Path]:
    """Every regular file under `root`, sorted, relative to it (symlinks followed)."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def directory_fingerprint(root: Path, *, skip_suffixes: tuple[str, ...] = ()) -> str:
    """A digest of the names and contents of the files in `root` (not its path or timestamps)."""
    digest = hashlib.sha256()
    hashes = file_hashes()
    for rel in list_files(root):
        if rel.name.startswith(".") or rel.suffix in skip_suffixes:
            continue
        digest.update(f"{rel.as_posix()}\0{hashes.sha256(root / rel)}\n".encode())
    return digest.hexdigest()[:32]

"""Check artifact directories against their manifest.json before Triton starts (the init container of the kubernetes kind).

    python3 verify_artifacts.py /store/build /store/prepare

Every directory must hold exactly the files its manifest lists (pipeline.artifacts: `files: {path: {size, sha256}}`),
with those sizes and SHA-256 digests: a claim filled from another build, or a file changed or truncated on the way,
stops the pod before the server loads it. Standard library only: it runs in the server image from a ConfigMap.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

MANIFEST = "manifest.json"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _present(root: str) -> set[str]:
    found = set()
    for directory, _, names in os.walk(root):
        for name in names:
            found.add(os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/"))
    return found - {MANIFEST}


def problems(root: str) -> list[str]:
    """What differs between `root` and its manifest (empty when it matches)."""
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as handle:
            recorded = json.load(handle)["files"]
    except (OSError, ValueError, KeyError) as error:
        return [f"{root}: no readable {MANIFEST} ({error})"]
    present = _present(root)
    found = [f"{root}/{name}: listed in the manifest, missing" for name in sorted(set(recorded) - present)]
    found += [f"{root}/{name}: not in the manifest" for name in sorted(present - set(recorded))]
    for name in sorted(set(recorded) & present):
        path = os.path.join(root, name)
        if os.path.getsize(path) != recorded[name]["size"]:
            found.append(f"{path}: size {os.path.getsize(path)}, the manifest says {recorded[name]['size']}")
        elif _sha256(path) != recorded[name]["sha256"]:
            found.append(f"{path}: SHA-256 differs from the manifest")
    return found


def main(roots: list[str]) -> int:
    if not roots:
        print("usage: verify_artifacts.py ARTIFACT_DIR...", file=sys.stderr)
        return 2
    found = [problem for root in roots for problem in problems(root)]
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(f"verified {', '.join(roots)} against their manifests")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

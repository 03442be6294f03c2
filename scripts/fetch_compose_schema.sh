#!/usr/bin/env bash
# Fetch the Compose Specification JSON schema that tests/pipeline/deploy/test_deploy.py validates the rendered
# compose files against, into <venv>/share/compose_spec.json. It is not committed: it is extracted
# from the docker-compose==1.29.2 wheel on PyPI (compose/config/compose_spec.json), whose SHA-256 is
# pinned below. Nothing from that wheel is installed.
#
#   scripts/fetch_compose_schema.sh [VENV]        (default .venv; the Makefile's venv step calls it)
#
# Offline, or when PyPI cannot be reached, it warns and exits 0: the schema tests then skip and say
# why. A wheel whose hash differs, or without the schema, is an error (exit 1).
set -euo pipefail

VENV="${1:-.venv}"
PY="$VENV/bin/python"
DEST="$VENV/share/compose_spec.json"
WHEEL_SHA256="8d5589373b35c8d3b1c8c1182c6e4a4ff14bffa3dd0b605fcd08f73c94cef809"
MEMBER="compose/config/compose_spec.json"

if [ ! -x "$PY" ]; then
    echo "fetch_compose_schema: no Python at $PY; create the virtual environment first" >&2
    exit 1
fi
if [ -s "$DEST" ] && "$PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(s.get("title") != "Compose Specification")' "$DEST"; then
    exit 0  # already there
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "docker-compose==1.29.2" >"$work/pip.log" 2>&1; then
    echo "fetch_compose_schema: WARNING: could not download docker-compose==1.29.2 (offline?); tests/pipeline/deploy/test_deploy.py will skip its schema validation" >&2
    tail -n 3 "$work/pip.log" >&2
    exit 0
fi

"$PY" - "$work" "$DEST" "$WHEEL_SHA256" "$MEMBER" <<'PYTHON'
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

work, dest, expected, member = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
wheels = sorted(work.glob("docker_compose-1.29.2-*.whl"))
if len(wheels) != 1:
    sys.exit(f"fetch_compose_schema: expected one docker-compose 1.29.2 wheel in {work}, found {[w.name for w in wheels]}")
digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
if digest != expected:
    sys.exit(f"fetch_compose_schema: {wheels[0].name} has SHA-256 {digest}, expected {expected}")
with zipfile.ZipFile(wheels[0]) as wheel:
    schema = json.loads(wheel.read(member))
if schema.get("title") != "Compose Specification" or "services" not in schema.get("properties", {}):
    sys.exit(f"fetch_compose_schema: {member} in {wheels[0].name} is not the Compose Specification schema")
dest.parent.mkdir(parents=True, exist_ok=True)
partial = dest.with_suffix(".json.partial")
partial.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
os.replace(partial, dest)
print(f"fetch_compose_schema: wrote {dest}")
PYTHON

"""Run inside the cpu image at build time: make the bundled tritonserver runnable at fixed paths.

    python -m pipeline.deploy.image_setup --backend-directory /opt/triton-backends --link /opt/tritonserver

Creates the private backend directory of symlinks (the recipe of `trtllm-pipeline serve`,
pipeline.serve.installation) and a symlink from `--link` to the wheel's `tritonserver/`, so the
compose command names `/opt/tritonserver/bin/tritonserver` whatever the Python version.

Then it runs the stub the way Triton's Python backend probes it before every model load
(python_backend src/stub_launcher.cc, `StubLauncher::Launch`): with no arguments, where a working stub
exits 1 ("Expected 9 arguments"). On any other status the backend assumes a missing execute bit and
`chmod`s the stub, which the hardened container refuses (not the owner; read-only root), and the model
load fails with "Failed to give execute permission to triton_python_backend_stub" — hiding the real
cause, usually a base image without the stub's libpython<X.Y>.so.1.0 (Debian's minimal python3 has
none). Checked here, the image build stops with the loader's own message instead.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipeline.errors import PipelineError, StageError
from pipeline.serve.installation import STUB, find_tritonserver, make_backend_directory

STUB_USAGE_STATUS = 1  # pb_stub.cc: fewer arguments than it needs -> exit(1); the backend's probe expects exactly this
STUB_PROBE_TIMEOUT_SECS = 30


def prepare(backend_directory: Path, link: Path) -> Path:
    """Set both up; the installation root the link points at."""
    installation = find_tritonserver()
    make_backend_directory(installation, backend_directory)
    check_stub(backend_directory / "python" / STUB)
    if link.is_symlink() or link.exists():
        if link.resolve() != installation.root.resolve():
            raise StageError(f"{link} already exists and does not point at {installation.root}")
        return installation.root
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(installation.root, target_is_directory=True)
    return installation.root


def check_stub(stub: Path) -> None:
    """Probe the stub as the Python backend does; a StageError with the stub's own output unless it exits 1."""
    try:
        result = subprocess.run([str(stub)], capture_output=True, text=True, timeout=STUB_PROBE_TIMEOUT_SECS, check=False)
    except OSError as error:
        raise StageError(f"the Python-backend stub {stub} cannot be run: {error}") from error
    if result.returncode == STUB_USAGE_STATUS:
        return
    output = (result.stderr or result.stdout).strip().splitlines()
    library = f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    raise StageError(
        f"the Python-backend stub {stub} exited {result.returncode} when run without arguments (a working stub exits "
        f"{STUB_USAGE_STATUS}): {output[-1] if output else 'no output'}. Triton would then try to chmod it at every model "
        "load, which the hardened container refuses",
        hint=f"the stub links {library}: the base image (deploy.image) must provide it "
        f"(Debian/Ubuntu: apt-get install libpython{sys.version_info[0]}.{sys.version_info[1]}; the python:*-slim images have it)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.deploy.image_setup", description=__doc__.splitlines()[0])
    parser.add_argument("--backend-directory", type=Path, required=True)
    parser.add_argument("--link", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        root = prepare(args.backend_directory, args.link)
    except PipelineError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.hint != error.default_hint:  # the CLI's default (--verbose) does not apply here
            print(f"hint: {error.hint}", file=sys.stderr)
        return 1
    print(f"tritonserver {root} linked at {args.link}; backends in {args.backend_directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run inside the cpu image at build time: make the bundled tritonserver runnable at fixed paths.

    python -m pipeline.deploy.image_setup --backend-directory /opt/triton-backends --link /opt/tritonserver

Creates the private backend directory of symlinks (the recipe of `trtllm-pipeline serve`,
pipeline.serve.installation) and a symlink from `--link` to the wheel's `tritonserver/`, so the
compose command names `/opt/tritonserver/bin/tritonserver` whatever the Python version.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.errors import PipelineError, StageError
from pipeline.serve.installation import find_tritonserver, make_backend_directory


def prepare(backend_directory: Path, link: Path) -> Path:
    """Set both up; the installation root the link points at."""
    installation = find_tritonserver()
    make_backend_directory(installation, backend_directory)
    if link.is_symlink() or link.exists():
        if link.resolve() != installation.root.resolve():
            raise StageError(f"{link} already exists and does not point at {installation.root}")
        return installation.root
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(installation.root, target_is_directory=True)
    return installation.root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.deploy.image_setup", description=__doc__.splitlines()[0])
    parser.add_argument("--backend-directory", type=Path, required=True)
    parser.add_argument("--link", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        root = prepare(args.backend_directory, args.link)
    except PipelineError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    print(f"tritonserver {root} linked at {args.link}; backends in {args.backend_directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

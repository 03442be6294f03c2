"""Where the project's own sources lie, found without importing them (the plan fingerprints them;
importing `pipeline.render` would load tritonclient and Jinja2 into `plan`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.errors import StageError


def package_dir(name: str) -> Path:
    """The directory of an importable package, located, not imported."""
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise StageError(f"the package {name!r} cannot be found", hint="reinstall trtllm-pipeline (pip install -e . in a checkout)")
    return Path(found.origin).parent


def model_repo_sources() -> Path:
    """The `model_repo/` directory next to the `pipeline` package (templates and Python model code):
    the checkout's in an editable install, the installed copy (package data) otherwise."""
    root = Path(__file__).resolve().parents[1] / "model_repo"
    if not (root / "templates").is_dir() or not (root / "python").is_dir():
        raise StageError(
            f"{root} with templates/ and python/ is missing; the package stage needs the project's model_repo/ sources",
            hint="reinstall trtllm-pipeline (its wheel carries model_repo/) or run from a source checkout (pip install -e .)",
        )
    return root

"""`trtllm-pipeline validate` in a fresh interpreter, to see both its answer and what it imported (validate stays light:
no torch, numpy or safetensors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.repo.test_light_commands import HEAVY


def validate_probe(store: Path, config: Path, *overrides: str) -> tuple[str, str]:
    """(its exit code and the heavy libraries it imported, what it printed)."""
    sets = [item for override in overrides for item in ("--set", override)]
    probe = (
        "import contextlib, io, sys\n"
        "from pipeline.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        f"    code = main(['--artifacts', {str(store)!r}, 'validate', {str(config)!r}, *{sets!r}])\n"
        f"print(code, sorted({{name.split('.')[0] for name in sys.modules}} & set({HEAVY!r})))\n"
        "print(out.getvalue())\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    first, _, rest = result.stdout.partition("\n")
    return first, rest + result.stderr

"""`validate` and `plan` read a YAML file and a model's config.json: they must not import the heavy
libraries the stages use (torch alone costs ~2 s of start-up on these machines)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

HEAVY = ("torch", "transformers", "modelopt", "safetensors", "tokenizers", "tritonclient", "grpc", "aiohttp", "jinja2", "numpy")


# the shipped LoRA adapter: validate reads its safetensors header by hand, not through the safetensors library
WITH_ADAPTER = ["--set", "build.lora.adapter_dirs=[../models/tiny-stdlib-llama-turtle-lora]"]


@pytest.mark.parametrize("command, extra", [("validate", []), ("plan", []), ("validate", WITH_ADAPTER)])
def test_light_commands_import_nothing_heavy(command, extra, tmp_path):
    probe = (
        "import contextlib, io, sys\n"
        "from pipeline.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main(['--artifacts', {str(tmp_path)!r}, {command!r}, {str(REPO / 'build_configs' / 'tiny-cpu.yaml')!r}, *{extra!r}])\n"
        f"print(code, sorted({{name.split('.')[0] for name in sys.modules}} & set({HEAVY!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.stdout.strip() == "0 []", result.stdout + result.stderr

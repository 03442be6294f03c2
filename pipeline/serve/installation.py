"""The `tritonserver` bundled in the nvidia-pytriton wheel, and what it needs to run standalone.

Recipe (found by running the nvidia-pytriton 0.7.0 wheel's tritonserver 2.51 on CPU; PyTriton's own launcher,
pytriton/server/triton_server.py, copies the stub instead and sets LD_LIBRARY_PATH): a private backend directory of symlinks into the
wheel (the stub is not where the Python backend looks for it, and a copied stub loses its
`$ORIGIN` RPATH), the virtual environment's `bin` first on PATH (the stub's embedded Python finds
its prefix, hence the venv's site-packages, through `python3` on PATH), and the base Python's
`lib` on LD_LIBRARY_PATH (the stub then loads the same libpython as the venv's interpreter).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError

PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstallation:
    root: Path  # <site-packages>/pytriton/tritonserver

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def caches_dir(self) -> Path:
        return self.root / "caches"

    @property
    def python_backend_dir(self) -> Path:
        return self.root / "backends" / "python"

    def stub(self, python_version: tuple[int, int] = sys.version_info[:2]) -> Path:
        return self.root / "python_backend_stubs" / f"{python_version[0]}.{python_version[1]}" / STUB


def find_tritonserver() -> TritonInstallation:
    """The installation inside the nvidia-pytriton wheel of the running environment."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StageError(
            "the nvidia-pytriton package (which bundles tritonserver) is not installed",
            hint="pip install nvidia-pytriton==0.7.0",
        )
    installation = TritonInstallation(Path(list(spec.submodule_search_locations)[0]) / "tritonserver")
    if not os.access(installation.binary, os.X_OK):
        raise StageError(f"{installation.binary} is missing or not executable; reinstall nvidia-pytriton")
    stub = installation.stub()
    if not stub.is_file():
        raise StageError(
            f"no Python-backend stub for Python {sys.version_info[0]}.{sys.version_info[1]} at {stub}",
            hint="use a Python version the wheel ships a stub for (3.8–3.13)",
        )
    return installation


def make_backend_directory(installation: TritonInstallation, directory: Path) -> Path:
    """`directory/python/` with symlinks to the backend library, its utils and the stub."""
    python_dir = directory / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    targets = {name: installation.python_backend_dir / name for name in PYTHON_BACKEND_FILES}
    targets[STUB] = installation.stub()
    for name, target in targets.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return directory


def server_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the venv's bin first on PATH, the base Python's lib on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join([venv_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)])
    python_lib = sysconfig.get_config_var("LIBDIR")
    if python_lib and Path(python_lib).is_dir():
        rest = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != python_lib]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([python_lib, *rest])
    # Tokenizers and transformers inside the models must never reach for the network.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env

"""Importing a module of scripts/ (not a package) from a test: it imports its siblings, so scripts/ goes on
sys.path while it loads."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from tests.conftest import REPO


def import_script(name: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))

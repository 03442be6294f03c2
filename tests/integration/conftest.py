"""The default config, built and packaged once per test session and shared by the modules that serve it.

Modules only read the shared store. One that writes into it (`serve --detach` keeps its state in
`<root>/tiny-cpu/.serve`) takes `private_tiny_cpu`, a copy of its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.serving import build_and_package, packaged

TINY_CPU = "tiny-cpu"


@pytest.fixture(scope="session")
def tiny_cpu_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny-cpu-artifacts")
    build_and_package(TINY_CPU, root)
    return root


@pytest.fixture(scope="session")
def tiny_cpu(tiny_cpu_root) -> dict[str, Path]:
    """engine, tokenizer and repository of the shared build (read only), and its root."""
    return {**packaged(TINY_CPU, tiny_cpu_root), "root": tiny_cpu_root}


@pytest.fixture(scope="module")
def private_tiny_cpu(tiny_cpu_root, tmp_path_factory) -> dict[str, Path]:
    """A copy of the shared build (file times kept, so every stage stays cached) that a module may write into."""
    root = tmp_path_factory.mktemp("private-artifacts") / "store"
    shutil.copytree(tiny_cpu_root, root, symlinks=True)
    return {**packaged(TINY_CPU, root), "root": root}

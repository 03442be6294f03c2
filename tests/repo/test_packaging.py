"""A non-editable install carries model_repo/ (templates and Python-backend code) and finds it.

The wheel is built offline from exactly what the cpu image's `pip install` gets (the deploy stage's
copy of the project), with setuptools' own PEP 517 hook (what `pip wheel --no-build-isolation` calls).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from pipeline.deploy.dockerfile import copy_project_source

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_model_repo_and_the_installed_package_finds_it(tmp_path):
    source = tmp_path / "src"
    copy_project_source(source, REPO)
    out = tmp_path / "wheel"
    build = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = out / build.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        site = tmp_path / "site-packages"
        archive.extractall(site)
    for kind, pattern in (("templates", "*.j2"), ("python", "*.py")):
        expected = {f"model_repo/{kind}/{path.name}" for path in (REPO / "model_repo" / kind).glob(pattern)}
        assert expected and expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert not any("__pycache__" in name for name in names)

    # Installed (unzipped) outside the checkout: the renderer finds the installed copy.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pipeline.render.repository import model_repo_sources\n"
        "import pipeline; print(pipeline.__file__); print(model_repo_sources())\n"
    )
    found = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr[-3000:]
    package_file, sources = found.stdout.strip().splitlines()
    assert Path(package_file).is_relative_to(site)
    assert Path(sources) == site / "model_repo"

"""Checks of a written kubernetes deployment directory, as `kubectl apply -k` would first read it: every kustomization
lists files that exist, every manifest is YAML documents with apiVersion, kind and a DNS-1123 metadata.name, and the
generated Secret's env file is there. Schemas are checked by the tests (kubernetes-validate, the vendored CRDs)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config.spec.kubernetes import DNS1123_SUBDOMAIN
from pipeline.deploy.kubernetes import names


def lint_directory(directory: Path) -> list[str]:
    root = directory / names.KUBERNETES_DIR
    kustomizations = sorted(root.rglob(names.KUSTOMIZATION))
    if not kustomizations:
        return [f"{directory} holds no {names.KUBERNETES_DIR}/**/{names.KUSTOMIZATION}"]
    problems = []
    for kustomization in kustomizations:
        try:
            document = yaml.safe_load(kustomization.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            problems.append(f"{kustomization}: not YAML ({error})")
            continue
        for entry in document.get("resources", []):
            path = kustomization.parent / entry
            if not path.exists():
                problems.append(f"{kustomization}: lists {entry}, which does not exist")
            elif path.is_file():
                problems += _manifest_problems(path)
        for generator in document.get("secretGenerator", []):
            problems += [f"{kustomization}: {env} is missing" for env in generator.get("envs", []) if not (kustomization.parent / env).is_file()]
    return problems


def _manifest_problems(path: Path) -> list[str]:
    try:
        documents = [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document is not None]
    except yaml.YAMLError as error:
        return [f"{path}: not YAML ({error})"]
    problems = []
    for index, document in enumerate(documents):
        where = f"{path} (document {index + 1})"
        if not isinstance(document, dict) or not document.get("apiVersion") or not document.get("kind"):
            problems.append(f"{where}: needs apiVersion and kind")
            continue
        name = (document.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not DNS1123_SUBDOMAIN.match(name):
            problems.append(f"{where}: metadata.name {name!r} is not a DNS-1123 name")
    return problems

"""Write a kubernetes deployment directory (layout in pipeline.deploy.kubernetes.names): what every kind holds
(pipeline.deploy.files), the manifests and kustomizations, secret.env, and the build context of the image with the
project installed (the cpu server, and on either target the OpenAI front end)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.spec import Spec
from pipeline.deploy import files, layout
from pipeline.deploy.base import DeploymentInputs
from pipeline.deploy.kubernetes import kustomize, llmapi_forms, names

HEADER = "# Rendered by trtllm-pipeline (deploy stage) for build {name!r}, target {target}. Do not edit: change the build config.\n"


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_documents(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False, width=4096, explicit_start=True)


@dataclass(frozen=True)
class KubernetesDeployment:
    directory: Path
    overlay: str  # the kustomization `kubectl apply -k` is given
    workload: str  # Deployment or LeaderWorkerSet
    files: tuple[Path, ...]


def rendered_files(spec: Spec, options_text: str | None = None) -> dict[str, str]:
    """Every manifest and kustomization of the deployment, as text by path (the secret excluded); `options_text`: the
    trtllm-serve form's --extra_llm_api_options YAML (pipeline.deploy.kubernetes.llmapi_forms)."""
    header = HEADER.format(name=spec.name, target=spec.build.target.value)
    rendered = kustomize.manifests(spec, options_text)
    texts = {path: header + dump_documents(documents) for path, documents in rendered.items()}
    for directory, kustomization in kustomize.kustomizations(spec, rendered).items():
        texts[f"{directory}/{names.KUSTOMIZATION}"] = header + dump_documents([kustomization])[len("---\n") :]
    return dict(sorted(texts.items()))


def write_deployment(spec: Spec, out_dir: Path, inputs: DeploymentInputs) -> KubernetesDeployment:
    """Render everything (refused before anything is written), then write it; links are relative to inputs.final_dir."""
    target = spec.build.target.value
    files.require_new_directory(out_dir)
    texts = rendered_files(spec, _trtllm_serve_options(spec, inputs))
    secrets = files.secret_values(inputs.secrets)
    out_dir.mkdir(parents=True, exist_ok=True)
    engine_dir, tokenizer_dir = inputs.engine_dir, inputs.tokenizer_dir
    written = files.write_container_repository(spec, out_dir, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, package_repository=inputs.package_repository)
    files.link_upstream(out_dir, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, base=inputs.final_dir or out_dir)
    written += [files.write_file(out_dir / path, text) for path, text in texts.items()]
    secret_text = "".join(
        [
            f"# The Triton admin APIs' '{layout.ADMIN_KEY_HEADER}' header, and the OpenAI front end's API keys (KEY or NAME:KEY,\n",
            "# comma-separated; the front end reads them from the Secret, mounted as a file). Keep this file private.\n",
            f"{layout.ADMIN_KEY_VARIABLE}={secrets[layout.ADMIN_KEY_VARIABLE]}\n",
            f"{layout.OPENAI_API_KEYS_VARIABLE}={secrets[layout.OPENAI_API_KEYS_VARIABLE]}\n",
        ]
    )
    written.append(files.write_file(out_dir / names.BASE_DIR / names.SECRET_ENV, secret_text, mode=0o600))
    written += files.write_monitoring(out_dir, spec, target)
    written += files.write_server_files(out_dir, spec, target, inputs.source_root)
    workload = [document for document in yaml.safe_load_all(texts[kustomize.workload_file(spec)]) if document][-1]["kind"]
    return KubernetesDeployment(out_dir, kustomize.default_overlay(spec), workload, tuple(sorted(written)))


def _trtllm_serve_options(spec: Spec, inputs: DeploymentInputs) -> str | None:
    """The trtllm-serve form's options YAML, rendered from the build's LLM() options as the package stage renders it."""
    llm_api = llmapi_forms.llm_api_of(spec)
    if llm_api is None or not llmapi_forms.runs_trtllm_serve(spec):
        return None
    return llm_api.openai_files(inputs.engine_dir, spec.serve, layout.ENGINE_MOUNT)[llm_api.openai_options_file]

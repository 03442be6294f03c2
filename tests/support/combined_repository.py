"""Several packaged model repositories as one, so that one tritonserver serves them all (test-only).

Each model `<name>` of the repository given under `prefix` becomes `<prefix>-<name>`: its directory, its
config's `name`, the ensemble's steps (`model_name`) and the parameters that name another model of the same
repository (the BLS's `*_model_name`, postprocessing's `llm_model_name`), and the paths relative to the
repository that start in a model's directory (tensorrt_llm's `xgrammar_tokenizer_info_path`). The rest is copied
as it is: the configs name the engine and tokenizer by absolute path, and the models read their contract.json
from their own directory. A model that names one outside its repository is refused.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

CONFIG_FILE = "config.pbtxt"


def served_name(prefix: str, model: str) -> str:
    return f"{prefix}-{model}"


def combine_repositories(repositories: Mapping[str, Path], out_dir: Path) -> Path:
    """Write the models of each `repositories[prefix]` into `out_dir` (new) renamed `<prefix>-<name>`; return it."""
    out_dir.mkdir(parents=True)
    for prefix, repository in repositories.items():
        models = sorted(path.parent.name for path in repository.glob(f"*/{CONFIG_FILE}"))
        for model in models:
            target = out_dir / served_name(prefix, model)
            shutil.copytree(repository / model, target)
            _rename_references(target / CONFIG_FILE, prefix, frozenset(models))
    return out_dir


def _rename_references(path: Path, prefix: str, models: frozenset[str]) -> None:
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())

    def renamed(model: str) -> str:
        if model not in models:
            raise ValueError(f"{path}: names the model {model!r}, which is not in its repository ({', '.join(sorted(models))})")
        return served_name(prefix, model)

    config.name = renamed(config.name)
    for step in config.ensemble_scheduling.step:
        step.model_name = renamed(step.model_name)
    for key, parameter in config.parameters.items():
        value = parameter.string_value
        if key.endswith("model_name") and value:
            parameter.string_value = renamed(value)
        elif value.partition("/")[0] in models:  # a file in a model's directory, relative to the repository
            head, _, rest = value.partition("/")
            parameter.string_value = f"{renamed(head)}/{rest}"
    path.write_text(text_format.MessageToString(config))

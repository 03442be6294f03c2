"""Write the repository of a target in NVIDIA's `llmapi` layout (pipeline.backends.base.LlmApiRepository), and its
trtllm-serve form, from the files its backend renders:

    <out_dir>/tensorrt_llm/config.pbtxt    linted and parsed with Triton's ModelConfig schema
    <out_dir>/tensorrt_llm/1/model.yaml    the LLM() options + triton_config
    <out_dir>/tensorrt_llm/1/model.py      the model code (model_repo/python)

    <serve_dir>/extra-llm-api-config.yml, command.json
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.backends.base import LlmApiRepository
from pipeline.config.spec import ServeSpec
from pipeline.errors import StageError
from pipeline.render.pbtxt import lint_config, parse_config
from pipeline.sources import model_repo_sources

CONFIG_FILE = "config.pbtxt"


def render_llmapi_repository(llm_api: LlmApiRepository, *, engine_dir: Path, serve: ServeSpec, out_dir: Path, model_path: str) -> list[Path]:
    files = llm_api.triton_files(engine_dir, serve, model_path)
    written = _write(files, out_dir)
    for path in written:
        if path.name == CONFIG_FILE:
            where = path.relative_to(out_dir).as_posix()
            text = path.read_text(encoding="utf-8")
            lint_config(text, where)
            if parse_config(text, where).name != path.parent.name:
                raise StageError(f"{where}: the config names another model than its directory {path.parent.name!r}")
    main, helpers = llm_api.code
    version_dir = out_dir / llm_api.model_name / "1"
    for source, name in [(main, "model.py"), *((helper, helper) for helper in helpers)]:
        shutil.copyfile(model_repo_sources() / "python" / source, version_dir / name)
        written.append(version_dir / name)
    return written


def render_openai_form(llm_api: LlmApiRepository, *, engine_dir: Path, serve: ServeSpec, out_dir: Path, model_path: str) -> list[Path]:
    return _write(llm_api.openai_files(engine_dir, serve, model_path), out_dir)


def _write(files: dict[str, str], out_dir: Path) -> list[Path]:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise StageError(f"{out_dir} is not empty; it is written into a new directory")
    written = []
    for relative, text in files.items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written

"""NVIDIA's own preprocessing and postprocessing, served beside this project's for the capacity bench.

`nvidia_dir` is TensorRT-LLM's `triton_backend/all_models/inflight_batcher_llm` (or a copy with its
`preprocessing/` and `postprocessing/`): each `config.pbtxt` plus `1/model.py`. They are NVIDIA's code: the bench
reads them from where the user put them (a scratch checkout) and copies them only into its own scratch repository.
Their config.pbtxt is filled as NVIDIA's `tools/fill_template.py` would fill it, with this repository's values;
the only other change is the model's name (`nv_preprocessing`, `nv_postprocessing`), so both sets run in one
server. `ADAPTATIONS` lists both, for the bench's recipe.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from pipeline.errors import SpecError

MODELS = {"preprocessing": "nv_preprocessing", "postprocessing": "nv_postprocessing"}
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
ADAPTATIONS = (
    "name: preprocessing → nv_preprocessing, postprocessing → nv_postprocessing (both sets in one server)",
    "${…} placeholders filled as tools/fill_template.py does: triton_max_batch_size = the repository's max_batch_size, "
    "tokenizer_dir = the repository's tokenizer, add_special_tokens / skip_special_tokens true, *_instance_count 1, "
    "max_queue_delay_microseconds 0, max_queue_size 0; multimodal_model_path, engine_dir and max_num_images empty "
    "(a text-only model: their model.py reads empty as unset)",
    "the ensemble (this project's) feeds nv_postprocessing no PRECEDING_IDS: NVIDIA's postprocessing takes only "
    "TOKENS_BATCH and SEQUENCE_LENGTH (and decodes each response on its own)",
)


def install(nvidia_dir: Path, repository: Path, *, tokenizer_dir: str, max_batch_size: int) -> None:
    """Copy NVIDIA's two models into `repository` as nv_preprocessing / nv_postprocessing, configs filled."""
    values = {
        "triton_max_batch_size": str(max_batch_size),
        "tokenizer_dir": tokenizer_dir,
        "add_special_tokens": "true",
        "skip_special_tokens": "true",
        "preprocessing_instance_count": "1",
        "postprocessing_instance_count": "1",
        "max_queue_delay_microseconds": "0",
        "max_queue_size": "0",
        "multimodal_model_path": "",
        "engine_dir": "",
        "max_num_images": "",
    }
    for source, name in MODELS.items():
        model_dir = Path(nvidia_dir) / source
        code, config = model_dir / "1" / "model.py", model_dir / "config.pbtxt"
        if not code.is_file() or not config.is_file():
            raise SpecError(
                f"--nvidia-models {nvidia_dir}: {source}/config.pbtxt and {source}/1/model.py are missing",
                hint="point it at TensorRT-LLM's triton_backend/all_models/inflight_batcher_llm (a scratch checkout)",
            )
        (repository / name / "1").mkdir(parents=True)
        shutil.copyfile(code, repository / name / "1" / "model.py")
        (repository / name / "config.pbtxt").write_text(filled_config(config.read_text(), name, values, str(config)))


def filled_config(text: str, name: str, values: dict[str, str], where: str) -> str:
    """NVIDIA's config.pbtxt with its placeholders filled from `values` and its model named `name`."""
    unknown = sorted(set(_PLACEHOLDER.findall(text)) - set(values))
    if unknown:
        raise SpecError(f"{where}: placeholders the bench cannot fill: {', '.join(unknown)}")
    filled = _PLACEHOLDER.sub(lambda match: values[match.group(1)], text)
    renamed, count = re.subn(r'^name:\s*"[^"]*"', f'name: "{name}"', filled, count=1, flags=re.MULTILINE)
    if count != 1:
        raise SpecError(f"{where}: no `name:` line to rename")
    return renamed

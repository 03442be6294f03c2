"""The capacity bench's model repository: the packaged one, with the GPU-pace stand-in where the cpu engine was,
and the variants it is compared with, served side by side by one tritonserver.

    tensorrt_llm                     the stand-in (standin/model.py): the cpu model's config.pbtxt, its code replaced
    preprocessing, postprocessing,   as packaged (what users get)
    <ensemble>, tensorrt_llm_bls
    postprocessing_batched           postprocessing as serve.postprocessing_dynamic_batching renders it
      + ensemble_batched
    floor_postprocessing             a postprocessing that does nothing (floor.py): the Python backend's own cost,
      + ensemble_floor               without and with dynamic batching
    floor_postprocessing_batched
      + ensemble_floor_batched
    nv_preprocessing,                NVIDIA's models from a TensorRT-LLM checkout (`nvidia_dir`), their config.pbtxt
    nv_postprocessing                filled as fill_template.py would (nvidia.py)
      + ensemble_nvidia

Each variant's ensemble is the packaged ensemble with its steps pointed at the variant's models. Never written
into a user's repository: the bench writes it into its own scratch directory.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from bench.capacity import nvidia
from bench.overhead.environment import load_module
from pipeline.errors import StageError
from pipeline.render.pbtxt import parse_config
from pipeline.sources import model_repo_sources

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
STANDIN_CODE = {"model.py": "model.py", "gpu_pace.py": "gpu_pace.py"}
STANDIN_HELPERS = ("model_parameters.py", "response_channel.py", "triton_io.py")
TOKENS_FILE = "standin_tokens.json"
# The stand-in's text (encoded with the repository's tokenizer): code and prose, and characters of 2, 3 and 4 UTF-8
# bytes, which a byte-level tokenizer splits over several tokens (every cut of a stream is then UTF-8-tested).
REFERENCE_TEXT = (
    "def capacity(tokens_per_s, instances):\n    return tokens_per_s / max(1, instances)  # per instance\n"
    "Grüße aus Zürich: ½ € für 3 Tassen Café, 東京 と 大阪 の 天気 は 晴れ, emoji 🚀🙂 and ∑ ∫ √ symbols. "
    "The quick brown fox jumps over the lazy dog; naïve façade, coöperate, résumé.\n"
)


@dataclass(frozen=True)
class BenchPath:
    name: str  # JSON key
    label: str  # table row
    model: str  # the model clients call
    stubs: tuple[str, ...]  # the Python models it adds to the stand-in (their CPU is "the Python models'")


def bench_paths(ensemble: str, *, nvidia_models: bool, only: tuple[str, ...] = ()) -> tuple[BenchPath, ...]:
    paths = [
        BenchPath("ensemble", "ensemble (as packaged)", ensemble, ("preprocessing", "postprocessing")),
        BenchPath("ensemble_batched", "ensemble, postprocessing dynamic batching", "ensemble_batched", ("preprocessing", "postprocessing_batched")),
        BenchPath("bls", "BLS (as packaged)", "tensorrt_llm_bls", ("preprocessing", "tensorrt_llm_bls")),
        BenchPath("floor", "ensemble, no-op postprocessing (floor)", "ensemble_floor", ("preprocessing", "floor_postprocessing")),
        BenchPath(
            "floor_batched",
            "ensemble, no-op postprocessing, dynamic batching (floor)",
            "ensemble_floor_batched",
            ("preprocessing", "floor_postprocessing_batched"),
        ),
    ]
    if nvidia_models:
        paths.append(BenchPath("nvidia", "ensemble, NVIDIA's pre/postprocessing", "ensemble_nvidia", ("nv_preprocessing", "nv_postprocessing")))
    return tuple(path for path in paths if not only or path.name in only)


def write_bench_repository(
    packaged: Path,
    batched_postprocessing_config: str,
    out: Path,
    *,
    rate: str,
    stream_interval: int,
    tokenizer_dir: Path,
    nvidia_dir: Path | None = None,
    cancellation_check_period_ms: int = 1000,
) -> list[int]:
    """Write the bench's repository into `out` (new); the stand-in's token cycle (what it will generate)."""
    if out.exists():
        raise StageError(f"{out} exists; the bench writes its repository into a new directory")
    shutil.copytree(packaged, out)
    ensemble = ensemble_name(out)
    cycle = standin_token_cycle(out, tokenizer_dir)
    _install_standin(out / "tensorrt_llm", cycle, rate=rate, stream_interval=stream_interval, period_ms=cancellation_check_period_ms)
    _copy_model(out, "postprocessing", "postprocessing_batched", config_text=batched_postprocessing_config)
    _copy_model(out, "postprocessing", "floor_postprocessing")
    _copy_model(out, "postprocessing", "floor_postprocessing_batched", config_text=batched_postprocessing_config)
    for floor in ("floor_postprocessing", "floor_postprocessing_batched"):
        shutil.copyfile(STANDIN_DIR / "floor.py", out / floor / "1" / "model.py")
    _write_ensemble(out, ensemble, "ensemble_batched", {"postprocessing": "postprocessing_batched"})
    _write_ensemble(out, ensemble, "ensemble_floor", {"postprocessing": "floor_postprocessing"})
    _write_ensemble(out, ensemble, "ensemble_floor_batched", {"postprocessing": "floor_postprocessing_batched"})
    if nvidia_dir is not None:
        preprocessing = _parse(out / "preprocessing" / "config.pbtxt")
        nvidia.install(nvidia_dir, out, tokenizer_dir=_parameter(preprocessing, "tokenizer_dir"), max_batch_size=preprocessing.max_batch_size)
        _write_ensemble(
            out,
            ensemble,
            "ensemble_nvidia",
            {"preprocessing": "nv_preprocessing", "postprocessing": "nv_postprocessing"},
            drop_inputs={"postprocessing": ("PRECEDING_IDS",)},
        )
    return cycle


def standin_token_cycle(repository: Path, tokenizer_dir: Path) -> list[int]:
    """REFERENCE_TEXT in token ids of the repository's own tokenizer, without its special tokens."""
    tokenizer = load_module(repository / "preprocessing" / "1" / "hf_tokenizer.py", "_capacity_bench_hf_tokenizer").HFTokenizer(tokenizer_dir)
    special = {tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id}
    cycle = [token for token in tokenizer.encode(REFERENCE_TEXT, add_special_tokens=False) if token not in special]
    if not cycle:
        raise StageError(f"the tokenizer in {tokenizer_dir} encodes the stand-in's text to no tokens")
    return cycle


def _install_standin(model_dir: Path, cycle: list[int], *, rate: str, stream_interval: int, period_ms: int) -> None:
    version = model_dir / "1"
    shutil.rmtree(version)
    version.mkdir()
    for source, name in STANDIN_CODE.items():
        shutil.copyfile(STANDIN_DIR / source, version / name)
    for helper in STANDIN_HELPERS:
        shutil.copyfile(model_repo_sources() / "python" / helper, version / helper)
    (version / TOKENS_FILE).write_text(json.dumps(cycle))
    config = _parse(model_dir / "config.pbtxt")
    for key, value in {"standin_tokens_per_s": rate, "stream_interval": str(stream_interval), "cancellation_check_period_ms": str(period_ms)}.items():
        config.parameters[key].string_value = value
    _write(model_dir / "config.pbtxt", config, "the GPU-pace stand-in (bench only): the cpu model's tensors, no engine")


def _copy_model(repository: Path, source: str, name: str, *, config_text: str | None = None) -> None:
    shutil.copytree(repository / source, repository / name)
    config = parse_config(config_text, name) if config_text is not None else _parse(repository / name / "config.pbtxt")
    config.name = name
    _write(repository / name / "config.pbtxt", config, f"bench copy of {source}")


def _write_ensemble(repository: Path, ensemble: str, name: str, models: dict[str, str], drop_inputs: dict[str, tuple[str, ...]] | None = None) -> None:
    config = _parse(repository / ensemble / "config.pbtxt")
    config.name = name
    for step in config.ensemble_scheduling.step:
        for dropped in (drop_inputs or {}).get(step.model_name, ()):
            del step.input_map[dropped]
        step.model_name = models.get(step.model_name, step.model_name)
    consumed = {tensor for step in config.ensemble_scheduling.step for tensor in step.input_map.values()} | {o.name for o in config.output}
    for step in config.ensemble_scheduling.step:  # an internal tensor nobody reads any more is not produced either
        for key in [key for key, tensor in step.output_map.items() if tensor not in consumed]:
            del step.output_map[key]
    (repository / name / "1").mkdir(parents=True)
    _write(repository / name / "config.pbtxt", config, f"bench copy of {ensemble} calling {', '.join(models.values())}")


def ensemble_name(repository: Path) -> str:
    for config_file in sorted(repository.glob("*/config.pbtxt")):
        if _parse(config_file).platform == "ensemble":
            return config_file.parent.name
    raise StageError(f"{repository} has no ensemble model")


def _parameter(config, key: str) -> str:
    return config.parameters[key].string_value


def _parse(path: Path):
    return parse_config(path.read_text(), str(path))


def _write(path: Path, config, note: str) -> None:
    path.write_text(f"# {note}\n" + text_format.MessageToString(config))

"""trtllm-build as a container job: what it reads before it runs, what it must have written after, its dry run.

`run_build` hands the job to a runner (pipeline.container_jobs: on this host, in the pinned Triton
TRT-LLM image, or a dry run). Before a real build: the quantized checkpoint this build was planned for, with
its weights and the LoRA adapters' weights; then `build_config.json` and `trtllm-build.sh` in the engine
directory; after: the engine directory TensorRT-LLM writes (`config.json` with `version`, `pretrained_config` and
`build_config`, and one `rank{N}.engine` per rank: NVIDIA/TensorRT-LLM tensorrt_llm/builder.py, `Engine.save`). A dry run
writes the engine directory's `config.json` instead (no GPU, weights or TensorRT-LLM), so the package and
deploy stages can render on a CPU-only machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pipeline.backends.engine.trtllm_build import ENGINE_LORA_DIR, SCRIPT_FILE, TrtllmBuild, render_script
from pipeline.config.lora_adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from pipeline.container_jobs import ContainerJob, JobRunner, Mount, RunnerUnavailable, Which
from pipeline.errors import StageError
from pipeline.quantization.trtllm_checkpoint.pretrained import pretrained_config

ENGINE_CONFIG_FILE = "config.json"
DRY_RUN_FILE = "dry_run.json"


@dataclass(frozen=True)
class BuildOutcome:
    engine_dir: Path
    dry_run: bool
    command: tuple[str, ...]  # what ran, or would run
    log: str = ""  # the tool's stdout


def run_build(build: TrtllmBuild, runner: JobRunner) -> BuildOutcome:
    """Produce the engine directory `build.output_dir` (or, for a dry run, its config and command)."""
    if runner.dry_run:
        return write_dry_run(build)
    job = build_job(build)
    runner.check(job)
    _require_weights(build)
    write_build_inputs(build)
    log = runner.run(job)
    check_engine_dir(build)
    return BuildOutcome(build.output_dir, False, runner.command(job), log)


def build_job(build: TrtllmBuild) -> ContainerJob:
    """The checkpoint and the adapters read-only, the engine directory read-write and the working directory."""
    adapters = [Mount(Path(d), Path(d)) for d in dict.fromkeys(build.settings.lora_dirs)]
    mounts = (Mount(build.checkpoint_dir, build.checkpoint_dir), *adapters, Mount(build.output_dir, build.output_dir, read_only=False))
    return ContainerJob(build.argv, build.version.image, build.output_dir, mounts, check_host=partial(_check_trtllm_build, build))


def _check_trtllm_build(build: TrtllmBuild, which: Which) -> None:
    if which("trtllm-build") is None:
        raise RunnerUnavailable(
            f"trtllm-build is not on PATH (the local runner needs TensorRT-LLM {build.version.version} and a GPU)",
            hint="run on a GPU host with tensorrt_llm installed, or use --runner docker or --runner dry-run",
        )


def write_build_inputs(build: TrtllmBuild) -> None:
    """`build_config.json` (the --build_config file) and `trtllm-build.sh` (the exact command) in the engine dir."""
    build.output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(build.build_config_path, build.build_config)
    script = build.output_dir / SCRIPT_FILE
    script.write_text(render_script(build), encoding="utf-8")
    script.chmod(0o755)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def read_checkpoint_config(build: TrtllmBuild) -> dict[str, Any] | None:
    path = build.checkpoint_dir / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: unreadable TensorRT-LLM checkpoint config ({exc})") from None
    if not isinstance(config, dict):
        raise StageError(f"{path}: a TensorRT-LLM checkpoint config must be a JSON object")
    check_checkpoint_matches(config, build)
    return config


def check_checkpoint_matches(config: dict[str, Any], build: TrtllmBuild) -> None:
    """The checkpoint decides quantization and parallelism (trtllm-build has no tp/pp flags since 0.12); it must be the one this build was planned for."""
    quant, mapping = config.get("quantization") or {}, config.get("mapping") or {}
    expected = build.quantization
    found = {
        "quantization.quant_algo": (quant.get("quant_algo"), expected["quant_algo"]),
        "quantization.kv_cache_quant_algo": (quant.get("kv_cache_quant_algo"), expected["kv_cache_quant_algo"]),
        "mapping.tp_size": (int(mapping.get("tp_size", 1)), build.settings.tp_size),
        "mapping.pp_size": (int(mapping.get("pp_size", 1)), build.settings.pp_size),
    }
    wrong = [f"{key} is {got!r}, the build expects {want!r}" for key, (got, want) in found.items() if got != want]
    if wrong:
        raise StageError(
            f"{build.checkpoint_dir}/config.json does not match the build config: " + "; ".join(wrong),
            hint="re-run the quantize stage for this config (or --force it)",
        )


def _require_weights(build: TrtllmBuild) -> None:
    if read_checkpoint_config(build) is None:
        raise RunnerUnavailable(f"{build.checkpoint_dir} has no config.json: trtllm-build needs the quantized TensorRT-LLM checkpoint")
    world = build.settings.world_size
    missing = [f"rank{r}.safetensors" for r in range(world) if not (build.checkpoint_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise RunnerUnavailable(f"{build.checkpoint_dir} lacks {', '.join(missing)} (world size {world}): trtllm-build needs the weights")
    for directory in build.settings.lora_dirs:
        absent = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (Path(directory) / name).is_file()]
        if absent:
            raise RunnerUnavailable(
                f"LoRA adapter {directory} lacks {', '.join(absent)}: trtllm-build --lora_dir needs the "
                "adapter's config and weights (a dry run needs only adapter_config.json)"
            )


def check_engine_dir(build: TrtllmBuild) -> None:
    """After a real build: config.json with the pinned version and one rank{N}.engine per rank (Engine.save)."""
    path = build.output_dir / ENGINE_CONFIG_FILE
    try:
        version = json.loads(path.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError) as exc:
        raise StageError(f"trtllm-build finished but {path} is missing or unreadable ({exc})") from None
    if version != build.version.version:
        raise StageError(
            f"the engine was built by TensorRT-LLM {version}, but the build pins {build.version.version}; "
            "engines only load in the exact version that built them"
        )
    missing = [f"rank{r}.engine" for r in range(build.settings.world_size) if not (build.output_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise StageError(f"trtllm-build finished but {build.output_dir} lacks {', '.join(missing)}")


# -- dry run --------------------------------------------------------------------------------------
def write_dry_run(build: TrtllmBuild) -> BuildOutcome:
    """Write what a build would read and write, without TensorRT-LLM, a GPU or weights.

    The engine directory gets `config.json` with exactly TensorRT-LLM's top-level keys (`version`,
    `pretrained_config`, `build_config` as the build would record it) and no `rank*.engine` (nor the `lora/<i>/`
    adapter copies); `dry_run.json` marks it as a dry run and lists what is missing.
    """
    checkpoint = read_checkpoint_config(build)
    if checkpoint is not None:
        pretrained, source = checkpoint, "checkpoint config.json"
    else:
        pretrained, source = derive_pretrained_config(_read_hf_config(build.hf_dir), build), "Hugging Face config.json (no checkpoint)"
    write_build_inputs(build)
    engine_config = {"version": build.version.version, "pretrained_config": pretrained, "build_config": build.engine_build_config}
    _write_json(build.output_dir / ENGINE_CONFIG_FILE, engine_config)
    _write_json(
        build.output_dir / DRY_RUN_FILE,
        {
            "dry_run": True,
            "trtllm_version": build.version.version,
            "image": build.version.image,
            "image_tag_inferred": build.version.triton_tag_inferred,
            "pretrained_config_from": source,
            "missing": [f"rank{r}.engine" for r in range(build.settings.world_size)]
            + [f"{ENGINE_LORA_DIR}/{i}/" for i in range(len(build.settings.lora_dirs))],
            "argv": list(build.argv),
            "decisions": [d.to_json() for d in build.decisions],
        },
    )
    return BuildOutcome(build.output_dir, True, build.argv)


def is_dry_run(engine_dir: Path) -> bool:
    return (engine_dir / DRY_RUN_FILE).is_file()


# -- pretrained_config without a checkpoint ---------------------------------------------------------
def _read_hf_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: cannot read the Hugging Face config ({exc})") from None
    if not isinstance(config, dict):
        raise StageError(f"{path}: a Hugging Face config must be a JSON object")
    return config


def derive_pretrained_config(hf: dict[str, Any], build: TrtllmBuild) -> dict[str, Any]:
    """The TensorRT-LLM checkpoint `config.json` the quantize stage would write for this model, from HF config only."""
    config = pretrained_config(hf, dtype=build.settings.dtype, mapping=build.mapping, quantization=build.quantization)
    eagle = {"num_eagle_layers": build.settings.num_eagle_layers} if build.settings.num_eagle_layers else {}
    return {
        "producer": {"name": "trtllm-pipeline", "note": "dry run: derived from the Hugging Face config.json, no weights"},
        **config,
        "architecture": build.settings.architecture,
        **eagle,
    }

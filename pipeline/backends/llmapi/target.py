"""The llmapi target: TensorRT-LLM's PyTorch backend (`LLM()`), no engine, two forms of one set of options.

Its quantize stage exports ModelOpt's unified Hugging Face checkpoint (`hf_checkpoint/`). Its build compiles
nothing: it resolves the build rows of the options table (pipeline.backends.llmapi.options) against the
version profile, writes them to `engine/llm_api_options.json` and hard-links the checkpoint's files into
`engine/` (the directory `LLM(model=...)` loads; artifacts are immutable, so links cost nothing and survive
a bind mount). The package stage renders NVIDIA's Triton `llmapi` repository and the trtllm-serve files
from those options plus the serve rows. A dry run writes the options without the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.backends.base import BuildJob, BuiltEngine, ComposeFacts, LlmApiRepository
from pipeline.backends.engine_facts import EngineFacts
from pipeline.backends.llmapi.forms import (
    LLM_MODEL,
    MODEL_YAML,
    OPENAI_CONTAINER_PORT,
    SERVE_OPTIONS_FILE,
    config_pbtxt,
    model_yaml,
    serve_command,
    serve_options_yaml,
)
from pipeline.backends.llmapi.lora import link_adapters, served_lora_options
from pipeline.backends.llmapi.options import (
    DRAFT_MODEL_DIR,
    build_options,
    merged_options,
    option_issues,
    serve_options,
    with_draft_model_dir,
)
from pipeline.backends.llmapi.versions import get_llmapi_version
from pipeline.config.gpus import RUNTIME_RESERVE_GB
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import ServeSpec, Spec, SpeculativeSpec, Target
from pipeline.config.targets import traits_of
from pipeline.errors import StageError
from pipeline.quantization.dispatch import UNIFIED_HF_DIR

OPTIONS_FILE = "llm_api_options.json"  # in the build's engine directory
SERVE_DIR = "trtllm_serve"  # the package artifact's trtllm-serve form
CUDA_GRAPH_GB = 0.2  # "each CUDA graph can use up to 200 MB of extra memory" (TorchLlmArgs.cuda_graph_config)
CUDA_GRAPHS_PADDED = 19  # enable_padding's batch sizes up to CudaGraphConfig's default 128: 1, 2, 4, 8, 16, ..., 128
LLMAPI_MEMORY_MODEL = (
    "PyTorch backend: weights load first, a profiling pass of max_num_tokens measures the activations, then "
    "kv_cache_config.free_gpu_memory_fraction of the memory still free goes to the KV cache; planned with the "
    f"engine's 5 GB reserve plus {CUDA_GRAPHS_PADDED} padded CUDA graphs × {CUDA_GRAPH_GB * 1000:.0f} MB (the upper "
    "bound NVIDIA's cuda_graph_config states)"
)


def read_build_options(engine_dir: Path) -> dict[str, Any]:
    path = engine_dir / OPTIONS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StageError(f"{path}: the llmapi build's LLM() options are unreadable ({error})") from None
    return record["options"]


def _served_options(engine_dir: Path, serve: ServeSpec, model_path: str) -> dict[str, Any]:
    build = read_build_options(engine_dir)
    options = {**merged_options(build, serve_options(serve)), **served_lora_options(build, serve, model_path)}
    return with_draft_model_dir(options, model_path)


def _triton_files(engine_dir: Path, serve: ServeSpec, model_path: str) -> dict[str, str]:
    options = _served_options(engine_dir, serve, model_path)
    return {
        f"{LLM_MODEL}/config.pbtxt": config_pbtxt(decoupled=serve.decoupled),
        f"{LLM_MODEL}/1/{MODEL_YAML}": model_yaml(options, model_path=model_path, decoupled=serve.decoupled),
    }


def _openai_files(engine_dir: Path, serve: ServeSpec, model_path: str) -> dict[str, str]:
    options = _served_options(engine_dir, serve, model_path)
    command = serve_command(model_path=model_path, options_file=SERVE_OPTIONS_FILE)
    return {
        SERVE_OPTIONS_FILE: serve_options_yaml(options),
        "command.json": json.dumps({"argv": command, "openai_base_url": "http://<host>:8000/v1"}, indent=2) + "\n",
    }


def _link_checkpoint(source: Path, destination: Path) -> int:
    """Hard-link (or, across file systems, copy) every file of `source` into `destination`; returns the count."""
    count = 0
    for path in sorted(source.rglob("*")):
        if not path.is_file():
            continue
        target = destination / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
        count += 1
    return count


class LlmapiBackend:
    target = Target.llmapi
    traits = traits_of(Target.llmapi)
    serves_here = False  # TensorRT-LLM's PyTorch backend needs a GPU: it runs in the compose deployment or on a GPU host
    triton_version = None  # NVIDIA's image of the TensorRT-LLM version
    llm_model = None
    llm_api = LlmApiRepository(
        model_name=LLM_MODEL,
        code=("tensorrt_llm_llmapi.py", ()),
        triton_files=_triton_files,
        openai_files=_openai_files,
        openai_options_file=SERVE_OPTIONS_FILE,
        openai_command=lambda model_path, options_file: serve_command(model_path=model_path, options_file=options_file),
        openai_image=lambda spec: get_llmapi_version(spec.build.trtllm_version).serve_image,
        openai_port=OPENAI_CONTAINER_PORT,
    )
    compose = ComposeFacts(
        profile="gpu",
        health_start_period="900s",  # loading an 8B checkpoint and capturing CUDA graphs takes minutes
        image_has_project=False,
        checks_engine_in_container=False,  # no engine: the checkpoint runs on whatever the image's TensorRT-LLM is
        reserves_gpus=True,
        locks_memory=True,
        mpi_leader_ranks=False,
        openai_server_profile="trtllm-serve",
    )

    def preflight(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        issues = option_issues(spec, model)
        if not issues and spec.build.runner.value == "docker" and spec.quantize.device.value == "cuda":
            from pipeline.container_jobs import DockerRunner, RunnerUnavailable

            try:
                DockerRunner(image=None, gpus=spec.deploy.gpus, shm_size=spec.deploy.shm_size).check_engine()
            except RunnerUnavailable as exc:
                issues.append((("build", "runner"), f"build.runner docker (the quantize job's container): {exc.message}"))
        return issues

    def build(self, job: BuildJob) -> dict[str, Any]:
        spec = job.spec
        version = get_llmapi_version(spec.build.trtllm_version)
        options = build_options(spec, job.model)
        job.engine_dir.mkdir(parents=True, exist_ok=True)
        record = {"target": self.target.value, "trtllm_version": version.version, "options": options}
        (job.engine_dir / OPTIONS_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        checkpoint = job.checkpoint_dir.parent / UNIFIED_HF_DIR
        dry_run = spec.build.runner.value == "dry-run"  # (the build digest hashes build.runner)
        linked = 0 if dry_run else _link_checkpoint(checkpoint, job.engine_dir)
        if not dry_run and not (job.engine_dir / "config.json").is_file():
            raise StageError(f"{checkpoint} holds no unified Hugging Face checkpoint (config.json) for LLM() to load")
        if job.draft_engine_dir is not None and not dry_run:  # draft-target: the draft stage's checkpoint, at <engine>/draft
            if not (job.draft_engine_dir / "config.json").is_file():
                raise StageError(f"{job.draft_engine_dir} holds no Hugging Face checkpoint (config.json) of the draft for speculative_model_dir")
            linked += _link_checkpoint(job.draft_engine_dir, job.engine_dir / DRAFT_MODEL_DIR)
        eagle = spec.build.speculative.eagle if spec.build.speculative is not None else None
        if eagle is not None and not dry_run:  # EAGLE-3: the user's draft checkpoint, at <engine>/draft
            linked += _link_checkpoint(eagle.heads, job.engine_dir / DRAFT_MODEL_DIR)
        adapter_files = 0 if dry_run else link_adapters(spec, job.engine_dir)  # build.lora's adapters, at <engine>/lora/<i>/
        what = "dry run: no checkpoint linked" if dry_run else f"{linked} checkpoint files linked from {checkpoint}"
        what += f", {adapter_files} LoRA adapter files" if adapter_files else ""
        job.log(f"TensorRT-LLM {version.version} PyTorch backend: wrote the LLM() options ({what}); nothing is compiled")
        return dict(
            trtllm_version=version.version,
            image=version.triton_image,
            serve_image=version.serve_image,
            runner=spec.build.runner.value,
            dry_run=dry_run,
            checkpoint_files=linked,
            adapter_files=adapter_files,
        )

    def llm_parameters(
        self, facts: EngineFacts, serve: ServeSpec, *, engine_dir: str, gpu_device_ids: Sequence[int], speculative: SpeculativeSpec | None
    ) -> dict[str, str]:
        raise StageError("build.target 'llmapi' has no ensemble tensorrt_llm model: its repository is NVIDIA's llmapi layout")

    def server_image(self, spec: Spec) -> tuple[str, str] | None:
        version = get_llmapi_version(spec.build.trtllm_version)
        note = f"TensorRT-LLM {version.version} llmapi profile"
        if version.triton_tag_inferred:
            note += f" (Triton tag {version.triton_tag} inferred, not in NVIDIA's compatibility matrix: verify it)"
        return version.triton_image, note

    def check_serving_host(self, spec: Spec, built: BuiltEngine) -> None:
        return None  # `serve` refuses the target itself (serves_here)

    def spec_issues(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        return option_issues(spec, model)

    def capacity_reserve(self, spec: Spec) -> tuple[float, str]:
        return RUNTIME_RESERVE_GB + CUDA_GRAPHS_PADDED * CUDA_GRAPH_GB, LLMAPI_MEMORY_MODEL


BACKEND = LlmapiBackend()

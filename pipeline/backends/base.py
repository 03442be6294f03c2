"""The target backend interface: every fact and operation that differs between build targets.

One module per target implements it (`cpu.py`, `engine_target.py`, `llmapi_target.py`), and
`registry.backend_for(target)` hands it out; callers ask the backend instead of comparing targets.
Adding a target is a `Target` member, its traits (`pipeline/config/targets.py`), its module and one
registry line. Implementations import what is heavy (refengine, TensorRT-LLM tooling) inside their
methods: `validate` and `plan` go through here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.backends.engine_facts import EngineFacts
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import ServeSpec, Spec, SpeculativeSpec, Target
from pipeline.config.targets import TargetTraits


@dataclass(frozen=True)
class BuildJob:
    """What a target's build reads and where it writes its engine directory."""

    spec: Spec
    model: ModelInfo
    checkpoint_dir: Path  # the quantize stage's TensorRT-LLM checkpoint
    engine_dir: Path  # written now (inside the stage's temporary directory)
    final_engine_dir: Path  # where it will live once the stage succeeds: a dry run's command names it
    log: Callable[[str], None]
    draft_engine_dir: Path | None = None  # the draft stage's engine directory (draft_tokens_external), else None


@dataclass(frozen=True)
class RuntimeAbilities:
    """What the runtime behind the `tensorrt_llm` model runs, for the engine ↔ Triton checks (pipeline.render.consistency)."""

    name: str  # as the consistency messages call it
    runs_refengine_engines: bool  # engines written by the cpu build (version 'refengine-…'), else by trtllm-build
    other_engine_kind: str  # why an engine of the other kind cannot run here
    weight_suffix: str  # the engine directory holds rank{N}<weight_suffix>
    lora: bool
    speculative_decoding: bool
    beam_search: bool
    multiple_ranks: bool


@dataclass(frozen=True)
class TritonLlmModel:
    """The `tensorrt_llm` model a target renders: Triton's Python backend running our model code, or a C++ backend."""

    template: str  # its config.pbtxt template in model_repo/templates
    # (model code, helper modules) in model_repo/python, copied into 1/; None: a C++ backend, 1/ stays empty
    code: tuple[str, tuple[str, ...]] | None
    returns_preceding_ids: bool  # the context tokens the postprocessing's incremental detokenizer needs
    always_context_logits: bool  # context logits without an engine built with gather_context_logits
    runtime: RuntimeAbilities
    # it takes TensorRT-LLM's draft_input_ids / draft_logits / draft_acceptance_threshold (a draft_tokens_external engine)
    takes_draft_tokens: bool = False
    # a draft-target repository serves the draft engine as a model of its own (tensorrt_llm_draft, which the BLS drafts
    # with); False: the engine speculates inside (the cpu engine carries its draft, <engine>/draft)
    serves_draft_model: bool = False
    reads_num_draft_tokens: bool = False  # a per-request draft length (contract.CPU_LLM_EXTRA_INPUTS)
    takes_priority: bool = False  # a per-request priority input (contract.CLIENT_PRIORITY_INPUTS reach it)
    # a relative file path in its parameters (xgrammar_tokenizer_info_path) is read against the repository; False:
    # the path is opened as given, against tritonserver's working directory (NVIDIA's model_instance_state.cc), so
    # the configs name the file absolutely
    reads_paths_in_repository: bool = False


@dataclass(frozen=True)
class ComposeFacts:
    """How a docker compose deployment runs the target's Triton (for pipeline/deploy)."""

    profile: str  # the compose profile of its services
    health_start_period: str  # before failed health checks count: loading an engine can take minutes
    # the image is built from the rendered Dockerfile with this project installed (so it can run the OpenAI
    # front end too); otherwise it is `server_image` as published
    image_has_project: bool
    checks_engine_in_container: bool  # the entrypoint checks the engine against the image's TensorRT-LLM and GPUs
    reserves_gpus: bool
    # memlock unlimited (NVIDIA's launch recipe: pinned host memory); setting it needs CAP_SYS_RESOURCE in the daemon
    locks_memory: bool
    # tp × pp > 1 runs one tritonserver per rank under mpirun (leader mode); False: one server process, whose
    # runtime starts its own ranks (the LLM API spawns its MPI workers)
    mpi_leader_ranks: bool = True
    # a second GPU service of another profile: the OpenAI-compatible server of the same build (None: none)
    openai_server_profile: str | None = None


@dataclass(frozen=True)
class LlmApiRepository:
    """A target whose Triton repository is one model clients call directly, configured by LLM() arguments
    (NVIDIA's `llmapi` layout), with trtllm-serve as its second form; pipeline.render writes both."""

    model_name: str  # the one model of the repository
    code: tuple[str, tuple[str, ...]]  # (model code, helper modules) in model_repo/python, copied into <model>/1/
    # (the build's engine directory, serve, the model directory as the server sees it) -> {relative path: text}
    triton_files: Callable[[Path, ServeSpec, str], dict[str, str]]
    openai_files: Callable[[Path, ServeSpec, str], dict[str, str]]  # the same inputs -> trtllm-serve's files
    openai_options_file: str  # which of them is the --extra_llm_api_options YAML
    openai_command: Callable[[str, str], list[str]]  # (model directory, options file) as the server sees them -> argv
    openai_image: Callable[[Spec], str]  # the published image trtllm-serve runs in
    openai_port: int  # trtllm-serve's port in its container


# (engine directory, build manifest notes) of the built engine, or None before a build
BuiltEngine = Callable[[], tuple[Path, Mapping[str, Any]] | None]


class TargetBackend(Protocol):
    target: Target
    traits: TargetTraits  # what the spec and the plan know of it
    serves_here: bool  # its Triton runs on this machine (serve, generate, openai, bench serve, the performance gate)
    llm_model: TritonLlmModel | None  # the `tensorrt_llm` model behind the ensemble; None: no ensemble repository
    llm_api: LlmApiRepository | None  # NVIDIA's llmapi layout instead of the ensemble (None: not this target)
    compose: ComposeFacts | None  # None: no docker compose deployment in this version
    # the tritonserver version `serve` and the deployments run where the project fixes it (cpu: the one bundled
    # with nvidia-pytriton); None: the published image of the target's version (NGC 25.09 or newer)
    triton_version: str | None

    def preflight(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        """What refuses the build before any stage runs."""
        ...

    def build(self, job: BuildJob) -> dict[str, Any]:
        """Write the engine directory; returns the notes for the build manifest."""
        ...

    def llm_parameters(
        self,
        facts: EngineFacts,
        serve: ServeSpec,
        *,
        engine_dir: str,
        gpu_device_ids: Sequence[int],
        speculative: SpeculativeSpec | None,
    ) -> dict[str, str]:
        """The `parameters` of its `tensorrt_llm` model."""
        ...

    def server_image(self, spec: Spec) -> tuple[str, str] | None:
        """(reference, note) of the published Triton image it serves with; None when the image is built from this project."""
        ...

    def check_serving_host(self, spec: Spec, built: BuiltEngine) -> None:
        """Refuse to serve here an engine this machine's runtime cannot run (raises)."""
        ...

    def spec_issues(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        """The target's rules over spec facts, which `validate` (and every command that loads a config) reports."""
        ...

    def capacity_reserve(self, spec: Spec) -> tuple[float, str]:
        """GB per GPU the capacity planner keeps for activations and the runtime, and the memory model it follows."""
        ...

"""The build targets, and what the spec and the plan know about each, below the backends that do the work.

The plan (and the config) cannot import `pipeline.backends` (docs/architecture.md#layers: the flow points
down to config), yet a target decides what some digests hash and which spec rules apply. Those few
facts are data, here; every other target fact and operation is the target's backend
(`pipeline.backends.registry.backend_for`), which carries these traits too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Target(str, Enum):
    engine = "engine"
    cpu = "cpu"
    llmapi = "llmapi"


@dataclass(frozen=True)
class TargetTraits:
    # the column of the model-family table (pipeline.config.families) that says which models it builds:
    # trtllm-build (TensorRT-LLM's MODEL_MAP), pytorch (the PyTorch backend's registry) or refengine
    model_backend: str
    # build.runner (local / docker / dry-run) runs its build, and its quantize job on quantize.device cuda
    builds_through_runner: bool
    # the build's choices depend on deploy.gpu (SM-dependent kernels), so the build digest hashes it
    build_reads_gpu: bool
    # the quantize job also exports ModelOpt's unified Hugging Face checkpoint (TensorRT-LLM's PyTorch backend reads it)
    exports_unified_hf: bool
    # its engine follows trtllm-build's plugin rules: the engine itself, and the cpu build, which records the same
    # plugin_config (so a config that packages on cpu builds on a GPU); llmapi runs no trtllm-build
    follows_trtllm_plugin_rules: bool
    # build.plugins.use_fp8_context_fmha: true turns FP8 context attention on (the cpu build has no FP8 kernels)
    runs_fp8_context_fmha: bool
    # the server places serve.instances.tensorrt_llm × tp_size × pp_size ranks on deploy.gpus, one GPU each
    places_ranks_on_deploy_gpus: bool
    # it builds a build.speculative section (the modes below excepted)
    builds_speculative: bool = False
    # why it builds no build.lora section; None: it builds one (its adapters are checked against the model at validate)
    no_lora_because: str | None = None
    # build.speculative.mode values it does not build, and why (its other modes it builds)
    refused_speculative_modes: Mapping[str, str] = field(default_factory=dict)
    no_kubernetes_because: str | None = None  # why deploy.kind kubernetes cannot render this target yet
    no_multinode_because: str | None = None  # why its ranks cannot span nodes (a LeaderWorkerSet); None: they can
    has_llmapi_forms: bool = False  # it runs as Triton's llmapi model or as trtllm-serve (deploy.kubernetes.llmapi_form)
    no_stream_interval_because: str | None = None  # why serve.stream_interval must stay 1; None: its server honours it
    # why it refuses build.speculative.draft_vocab_size (a draft proposing only the first N token ids); None: it builds it
    no_draft_vocab_size_because: str | None = None
    # the EAGLE generation its mode eagle builds from build.speculative.eagle.heads: "EAGLE-1/2" (trtllm-build's
    # EagleForCausalLM, a static tree of eagle_choices) or "EAGLE-3" (the PyTorch backend's Eagle3DecodingConfig)
    eagle_generation: str | None = None
    # why it refuses build.speculative.medusa.vocab_size (Medusa heads proposing only the first M token ids)
    no_medusa_vocab_size_because: str | None = None
    # its LLM model streams at a GPU's pace: the package stage sizes the Python models' instances for the GPU's token rate
    streams_at_gpu_pace: bool = False
    # it runs the TensorRT-LLM checkpoint the quantize stage converts, so a published ModelOpt unified checkpoint in a
    # format the converter takes is served as published: converted from its own scales, no calibration
    converts_published: bool = False


TARGET_TRAITS: dict[Target, TargetTraits] = {
    Target.engine: TargetTraits(
        model_backend="trtllm-build",
        builds_through_runner=True,
        build_reads_gpu=True,
        exports_unified_hf=False,
        follows_trtllm_plugin_rules=True,
        runs_fp8_context_fmha=True,
        places_ranks_on_deploy_gpus=True,
        builds_speculative=True,
        refused_speculative_modes={
            "prompt_lookup": "TensorRT-LLM 1.2 drafts prompt-lookup tokens outside the engine, in examples/run.py "
            "(ModelRunnerCpp with prompt_lookup_config); NVIDIA's Triton models have no prompt-lookup drafter (the "
            "tensorrt_llm_bls drafts only with a draft model, tensorrt_llm_draft_model_name), so a served "
            "draft_tokens_external engine would never receive draft tokens; use draft_tokens_external with a draft "
            "model, or lookahead_decoding (the engine's own n-gram drafting)",
            "mtp": "multi-token prediction runs on TensorRT-LLM's PyTorch backend only (MTPDecodingConfig); trtllm-build has no MTP mode",
        },
        no_stream_interval_because="the tensorrtllm C++ backend sends one response per generated token: its config.pbtxt "
        "has no stream_interval parameter (that is an LLM API option of TensorRT-LLM's PyTorch backend: target llmapi)",
        no_draft_vocab_size_because="TensorRT-LLM 1.2's draft-target has no draft-vocabulary cut (trtllm-build builds the "
        "draft's whole lm_head, and the draft engine is served as is; a reduced draft vocabulary exists there only inside "
        "trained EAGLE-3 heads)",
        no_medusa_vocab_size_because="TensorRT-LLM 1.2's Medusa has no vocabulary cut (its conversion builds every "
        "head's whole lm_head, the model's vocabulary wide)",
        streams_at_gpu_pace=True,
        eagle_generation="EAGLE-1/2",
        converts_published=True,
    ),
    Target.cpu: TargetTraits(
        model_backend="refengine",
        builds_through_runner=False,
        build_reads_gpu=False,
        exports_unified_hf=False,
        follows_trtllm_plugin_rules=True,
        runs_fp8_context_fmha=False,
        places_ranks_on_deploy_gpus=False,
        builds_speculative=True,
        # refengine speculates with a draft model, with n-grams of the request (prompt lookup) and with Medusa heads
        refused_speculative_modes={
            "lookahead_decoding": "the reference engine (refengine) drafts with a draft model (draft_tokens_external), "
            "with n-grams of the request (prompt_lookup) or with Medusa heads (medusa), not with lookahead decoding's "
            "Jacobi n-gram pool",
            "eagle": "the reference engine (refengine) has no EAGLE draft layer; its tree speculation is medusa",
            "mtp": "the reference engine (refengine) runs no multi-token-prediction layers (the DeepSeek-V3 family is not a refengine model)",
        },
        converts_published=True,
    ),
    Target.llmapi: TargetTraits(
        model_backend="pytorch",
        # dry-run writes the LLM() options without weights; docker runs the quantize job (cuda) in the pinned image
        builds_through_runner=True,
        build_reads_gpu=False,
        exports_unified_hf=True,
        follows_trtllm_plugin_rules=False,
        runs_fp8_context_fmha=False,
        places_ranks_on_deploy_gpus=True,  # LLM() runs tp × pp ranks, one GPU each, on the GPUs the container gets
        # speculative_config per mode, and the refusals' reasons: pipeline/speculative/<mode>.py llmapi_config
        builds_speculative=True,
        refused_speculative_modes={
            "lookahead_decoding": "TensorRT-LLM's PyTorch backend has no lookahead decoding (LookaheadDecodingConfig runs on "
            "the engine path only); its draft-free drafting is prompt_lookup (NGram)",
            "medusa": "TensorRT-LLM 1.2's PyTorch backend has no Medusa (MedusaDecodingConfig.supports_backend excludes "
            "pytorch); its head-based drafting is eagle (EAGLE-3) or mtp",
        },
        no_multinode_because="NVIDIA launches the LLM API across nodes with trtllm-llmapi-launch under srun/mpirun, one MPI "
        "process per rank (examples/llm-api/llm_mgmn_trtllm_serve.sh: 'experimental and may not work on all systems'), not "
        "with the leader mode of one tritonserver per rank this version renders; keep tp × pp within one node",
        has_llmapi_forms=True,
        eagle_generation="EAGLE-3",
        no_draft_vocab_size_because="TensorRT-LLM 1.2's draft-target has no draft-vocabulary cut (LLM() loads the whole "
        "draft checkpoint named by speculative_config's speculative_model_dir; a reduced draft vocabulary exists there "
        "only inside trained EAGLE-3 heads)",
        no_medusa_vocab_size_because="TensorRT-LLM 1.2's PyTorch backend has no Medusa (MedusaDecodingConfig excludes it)",
    ),
}


def traits_of(target: Target) -> TargetTraits:
    return TARGET_TRAITS[target]


def targets_on(model_backend: str) -> tuple[str, ...]:
    """The build.target values whose models `model_backend` runs."""
    return tuple(t.value for t, traits in TARGET_TRAITS.items() if traits.model_backend == model_backend)

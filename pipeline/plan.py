"""Plan: which stages run, and the content digest of each. A pure function of the Spec plus environment facts.

A stage's digest hashes the slice of the Spec it reads, the digests of the stages it consumes, the
versions of the tools that shape its output, and the version of the stage's own implementation.
Changing a field that only a later stage reads therefore leaves earlier digests (and artifacts) alone.
STAGE_DEFS declares each slice once; the digest's inputs and the stage itself see it through a SpecSlice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pipeline.config.spec import Spec
from pipeline.config.targets import traits_of
from pipeline.spec_dump import dump, dump_build, dump_deploy, dump_present, dump_speculative
from pipeline.spec_slice import SpecSlice

DIGEST_LENGTH = 16


@dataclass(frozen=True)
class EnvFacts:
    """What the plan needs to know about the machine and the inputs on disk."""

    tools: dict[str, str]
    model_fingerprint: str
    calibration_fingerprint: str = ""  # content digest of the calibration files ("" when none)
    heldout_fingerprint: str = ""  # content digest of the accuracy gate's held-out files
    baseline_fingerprint: str = ""  # content digest of gate.accuracy.baseline's directory ("" when none)
    # Code that artifacts carry as files: the model repository's templates and Python models
    # (package), and the project source the cpu image installs (deploy).
    model_repo_fingerprint: str = ""
    project_fingerprint: str = ""
    lora_fingerprint: str = ""  # content digest of build.lora's adapter directories, in order ("" when none)
    # content digest of build.speculative.draft.source or of the medusa / eagle heads directory ("" when none)
    draft_fingerprint: str = ""


@dataclass(frozen=True)
class StageDef:
    """One stage, and the slice of the Spec it sees: its digest's `inputs` and the stage itself read only
    `hashes + via_upstream + unhashed` (and STORE_KEYS), through a SpecSlice. tests/pipeline/test_stage_reads.py
    runs every stage on a recording Spec and fails when a stage reads a path its digest does not hash."""

    name: str
    version: int  # bump when the stage's output changes for the same inputs
    upstream: tuple[str, ...]
    tools: tuple[str, ...]
    inputs: Callable[[Spec, EnvFacts], dict[str, Any]]
    summary: str
    applies: Callable[[Spec], bool] = lambda spec: True
    hashes: tuple[str, ...] = ()  # Spec paths this stage's digest hashes ("serve": the section, "build.tp_size": one field)
    via_upstream: tuple[str, ...] = ()  # read here, hashed by the digest of a stage upstream (so part of this digest too)
    unhashed: Mapping[str, str] = field(default_factory=dict)  # read here and need no hashing: path -> why

    def spec_slice(self, spec: Spec) -> Spec:
        # Typed as the Spec it stands in for (it reads as the Spec does, for the declared paths), so that mypy checks
        # what a stage and its digest read against the Spec's fields; SpecSlice itself answers every read with Any.
        return cast(Spec, SpecSlice(spec, (*self.hashes, *self.via_upstream, *self.unhashed, *STORE_KEYS), owner=self.name))


# Every artifact lives under artifacts/<name>/, so a stage may read these without hashing them: an artifact
# is never reused by a build of another name.
STORE_KEYS = ("name",)


@dataclass(frozen=True)
class StagePlan:
    name: str
    digest: str
    inputs: dict[str, Any]
    upstream: dict[str, str]
    tools: dict[str, str]
    summary: str

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.digest}"


@dataclass(frozen=True)
class Plan:
    build_name: str
    stages: tuple[StagePlan, ...] = field(default_factory=tuple)

    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    def stage(self, name: str) -> StagePlan:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def until(self, name: str | None) -> tuple[StagePlan, ...]:
        if name is None:
            return self.stages
        index = self.names().index(name)
        return self.stages[: index + 1]

    def to_json(self) -> dict[str, Any]:
        return {
            "build": self.build_name,
            "stages": [
                {"name": s.name, "digest": s.digest, "dir": s.dirname, "upstream": s.upstream, "inputs": s.inputs, "tools": s.tools} for s in self.stages
            ],
        }


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def digest_of(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:DIGEST_LENGTH]


def _speculative(spec: Spec) -> dict[str, Any]:
    """build.speculative, for the stages that render Triton's decoding parameters from it (absent: nothing)."""
    if spec.build.speculative is None:
        return {}
    # the draft's content is hashed by the draft stage upstream
    return {"speculative": dump_speculative(dump(spec.build.speculative), draft_source="")}


def _prepare_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    # The source's content, not its path: moving the checkout does not invalidate the cache.
    return {"model_fingerprint": facts.model_fingerprint, "copy_weights": spec.model.copy_weights, **_dry_run_flag(spec)}


def _quantize_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    quantize = dump(spec.quantize)
    # File contents, not their (absolute) paths: moving the checkout keeps the cache.
    quantize["calibration"]["files"] = facts.calibration_fingerprint
    return {
        "quantize": quantize,
        "dtype": spec.model.dtype.value,
        "mapping": {"tp_size": spec.build.tp_size, "pp_size": spec.build.pp_size},
        "unified_hf": traits_of(spec.build.target).exports_unified_hf,
        **_dry_run_flag(spec),
        **_quantize_route(spec),
    }


def _quantize_route(spec: Spec) -> dict[str, Any]:
    """Where the quantize job runs, when that changes what the artifact holds (pipeline.quantization.dispatch).

    In this process on quantize.device (the default): nothing to add. A target that builds through build.runner
    (the engine target) quantizes through it on cuda: `local` uses this host's torch/ModelOpt (already in the
    stage's tools), `docker` those of the version profile's image (named by trtllm_version). A dry run writes
    quantize.sh and the request, whose header names the image and, on cuda, the `docker run` with deploy.gpus
    and deploy.shm_size.
    """
    if not traits_of(spec.build.target).builds_through_runner:
        return {}
    runner, cuda = spec.build.runner.value, spec.quantize.device.value == "cuda"
    if runner == "dry-run":
        route: dict[str, Any] = {"runner": runner, "trtllm_version": spec.build.trtllm_version}
        if cuda:
            route["docker"] = {"gpus": list(spec.deploy.gpus), "shm_size": spec.deploy.shm_size}
        return route
    if not cuda:
        return {}
    return {"runner": runner, "trtllm_version": spec.build.trtllm_version} if runner == "docker" else {"runner": runner}


def _dry_run_flag(spec: Spec) -> dict[str, Any]:
    return {"dry_run": True} if spec.dry_run else {}


def _build_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "build": dump_build(spec, lora_fingerprint=facts.lora_fingerprint, draft_fingerprint=facts.draft_fingerprint),
        "dtype": spec.model.dtype.value,
    }
    if traits_of(spec.build.target).build_reads_gpu:
        inputs["gpu"] = spec.deploy.gpu.value if spec.deploy.gpu is not None else None
        # trtllm-build's settings carry the serve switches that need paged context FMHA: the build refuses an
        # engine without it for them and records a warning about chunked context (trtllm_rules)
        inputs["serve_needs"] = {name: getattr(spec.serve, name) for name in _ENGINE_SERVE_NEEDS}
    return inputs


_ENGINE_SERVE_NEEDS = ("enable_kv_cache_reuse", "enable_chunked_context")


def _draft_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    """What pipeline.config.spec.draft.draft_spec reads: the draft's spec is derived from the model's sections."""
    quantize = dump(spec.quantize)
    quantize["calibration"]["files"] = facts.calibration_fingerprint
    inputs = _build_inputs(spec, facts)
    inputs.update(
        quantize=quantize,
        serve_instances=spec.serve.instances.tensorrt_llm,
        gpu=spec.deploy.gpu.value if spec.deploy.gpu is not None else None,
        serve_needs={name: getattr(spec.serve, name) for name in _ENGINE_SERVE_NEEDS},
        **_dry_run_flag(spec),
        **_quantize_route(spec),
    )
    return inputs


def _has_draft(spec: Spec) -> bool:
    return spec.build.speculative is not None and spec.build.speculative.draft is not None


def _gate_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    accuracy = dump(spec.gate.accuracy)
    accuracy["heldout_files"] = facts.heldout_fingerprint
    if accuracy.pop("baseline") is not None:  # left out while unset: the digests of earlier gates stay what they were
        accuracy["baseline"] = facts.baseline_fingerprint
    return {"accuracy": accuracy, "dtype": spec.model.dtype.value}


def _package_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    return {
        "serve": dump_present(spec.serve),
        "target": spec.build.target.value,
        "gpus": list(spec.deploy.gpus),
        "model_repo_code": facts.model_repo_fingerprint,
        **_speculative(spec),
    }


def _slo_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    return {"performance": dump(spec.gate.performance), "name": spec.name, "deploy": dump_deploy(spec)}


def _deploy_inputs(spec: Spec, facts: EnvFacts) -> dict[str, Any]:
    return {
        "name": spec.name,
        "deploy": dump_deploy(spec),
        "serve": dump_present(spec.serve),
        "target": spec.build.target.value,
        "trtllm_version": spec.build.trtllm_version,
        **_speculative(spec),
        "mapping": {"tp_size": spec.build.tp_size, "pp_size": spec.build.pp_size},
        "project_code": facts.project_fingerprint,
    }


# Why a path may be read without being hashed.
_WHERE_IT_RUNS = "the devices and /dev/shm of the container the job runs in: where it runs, not what it writes"

STAGE_DEFS: tuple[StageDef, ...] = (
    # Version 2: weights recorded by hash (or copied), never hard-linked: older, linked artifacts are not reused.
    StageDef(
        "prepare",
        2,
        (),
        ("trtllm_pipeline", "safetensors"),
        _prepare_inputs,
        "validate and record the Hugging Face checkpoint",
        hashes=("model.copy_weights", "dry_run"),
    ),
    StageDef(
        "quantize",
        1,
        ("prepare",),
        ("trtllm_pipeline", "torch", "modelopt", "transformers", "safetensors"),
        _quantize_inputs,
        "quantize with ModelOpt and export the TensorRT-LLM checkpoint",
        hashes=("quantize", "model.dtype", "build.tp_size", "build.pp_size", "build.target", "build.runner", "build.trtllm_version", "dry_run"),
        # also hashed where a dry run's script names them (the `docker run` of a cuda job)
        unhashed={"deploy.gpus": _WHERE_IT_RUNS, "deploy.shm_size": _WHERE_IT_RUNS},
    ),
    StageDef(
        "draft",
        1,
        (),
        ("trtllm_pipeline", "torch", "modelopt", "transformers", "safetensors"),
        _draft_inputs,
        "quantize and build the draft model of draft-target speculative decoding",
        applies=_has_draft,
        hashes=(
            "build",
            "quantize",
            "model.dtype",
            "deploy.gpu",
            "serve.instances.tensorrt_llm",
            "dry_run",
            *(f"serve.{name}" for name in _ENGINE_SERVE_NEEDS),
        ),
        unhashed={"deploy.gpus": _WHERE_IT_RUNS, "deploy.shm_size": _WHERE_IT_RUNS},
    ),
    StageDef(
        "build",
        1,
        ("quantize", "draft"),  # the cpu engine directory carries the draft's (<engine>/draft)
        ("trtllm_pipeline",),
        _build_inputs,
        "build the engine directory for the target",
        hashes=("build", "model.dtype", "deploy.gpu", *(f"serve.{name}" for name in _ENGINE_SERVE_NEEDS)),
        via_upstream=("quantize.algo", "quantize.kv_cache", "quantize.group_size"),
        unhashed={"deploy.gpus": _WHERE_IT_RUNS, "deploy.shm_size": _WHERE_IT_RUNS},
    ),
    StageDef(
        "gate",
        1,
        ("prepare", "quantize"),
        ("trtllm_pipeline", "torch", "modelopt", "transformers"),
        _gate_inputs,
        "accuracy gate: quantized vs unquantized perplexity on held-out text",
        applies=lambda spec: spec.gate.accuracy is not None,
        hashes=("gate.accuracy", "model.dtype"),
        # build.target and the group size: the quantization it reports (a published checkpoint's own format)
        via_upstream=("quantize.algo", "quantize.kv_cache", "quantize.group_size", "build.target"),
    ),
    StageDef(
        "package",
        1,
        ("prepare", "build", "gate", "draft"),  # after a gate, a repository is tied to the verdict it passed
        ("trtllm_pipeline", "transformers", "tokenizers"),
        _package_inputs,
        "render the Triton model repository and check it against the engine",
        hashes=("serve", "build.target", "deploy.gpus", "build.speculative"),
        # the capacity planner sizes the Python models' instances for the GPU (engine target): the build hashes these
        via_upstream=("dry_run", "build", "quantize.algo", "quantize.kv_cache", "quantize.group_size", "deploy.gpu"),
    ),
    StageDef(
        "slo",
        1,
        ("prepare", "package"),
        ("trtllm_pipeline", "tritonclient"),
        _slo_inputs,
        "performance gate: load-test the served repository against gate.performance",
        applies=lambda spec: spec.gate.performance is not None,
        hashes=("gate.performance", "name", "deploy"),
        via_upstream=("dry_run", "build.max_input_len", "build.target"),  # build.target: which contract a gate.performance.url speaks
    ),
    # after a performance gate, a deployment is tied to the verdict it passed
    StageDef(
        "deploy",
        1,
        ("prepare", "build", "package", "slo", "draft"),
        ("trtllm_pipeline",),
        _deploy_inputs,
        "render the docker compose deployment",
        hashes=("name", "deploy", "serve", "build.target", "build.trtllm_version", "build.speculative", "build.tp_size", "build.pp_size"),
        via_upstream=("dry_run",),
    ),
)


def stage_def(name: str) -> StageDef:
    for definition in STAGE_DEFS:
        if definition.name == name:
            return definition
    raise KeyError(name)


def plan(spec: Spec, facts: EnvFacts, stage_defs: tuple[StageDef, ...] = STAGE_DEFS) -> Plan:
    planned: list[StagePlan] = []
    digests: dict[str, str] = {}
    for stage in stage_defs:
        if not stage.applies(spec):
            continue
        inputs = stage.inputs(stage.spec_slice(spec), facts)
        # An upstream stage that does not apply to this spec (e.g. no gate configured) is left out.
        upstream = {name: digests[name] for name in stage.upstream if name in digests}
        tools = {name: facts.tools.get(name, "absent") for name in stage.tools}
        digest = digest_of({"stage": stage.name, "version": stage.version, "inputs": inputs, "upstream": upstream, "tools": tools})
        digests[stage.name] = digest
        planned.append(StagePlan(stage.name, digest, inputs, upstream, tools, stage.summary))
    return Plan(spec.name, tuple(planned))

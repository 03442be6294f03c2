"""The build spec: what one YAML file in `build_configs/` may say.

Every model is frozen and forbids unknown keys; every field carries a description (the field
reference docs/reference.md and `build_configs/schema.json` are generated from them). A validator's message starts
with the field it is about and names the other fields involved; the loader prefixes the field only to a
message that does not (pydantic's own, or a section's that cannot know its path, like LatencyLimits'), so
each field is named once. Checks that need the model's own `config.json` live in
`pipeline.config.model_checks`, not here, so this package stays pure.

One module per section (model.py: model and quantize, build.py, serve.py, deploy.py, gate.py), the
enums in choices.py, the rules across sections in rules.py; the root `Spec` is here, and every public
name is importable from `pipeline.config.spec`.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.spec.build import BuildSpec, LoraSpec, PluginSpec
from pipeline.config.spec.choices import (
    BuildRunnerKind,
    DeployKind,
    GateEndpoint,
    GemmPlugin,
    GPUModel,
    GuidedDecodingBackend,
    KVCacheQuant,
    KVCacheType,
    LoraAdapterSource,
    LoraTargetModule,
    ModelDType,
    PluginDType,
    QuantAlgo,
    QuantDevice,
    SchedulerPolicy,
    SpeculativeMode,
)
from pipeline.config.spec.deploy import DeploySpec
from pipeline.config.spec.gate import AccuracyGateSpec, GateSpec, GoodputSpec, LatencyLimits, PerformanceGateSpec
from pipeline.config.spec.model import CalibrationSpec, ModelSpec, QuantizeSpec
from pipeline.config.spec.rules import check_cross_section
from pipeline.config.spec.serve import InstanceCounts, ServeLoraSpec, ServeSpec
from pipeline.config.spec.speculative import (
    MAX_DRAFT_LEN_CAP,
    DraftModelSpec,
    DraftQuantizeSpec,
    LookaheadSpec,
    PromptLookupSpec,
    SpeculativeSpec,
    lookahead_max_draft_len,
)
from pipeline.config.spec.strict import StrictModel
from pipeline.config.targets import Target, traits_of

__all__ = [
    "AccuracyGateSpec",
    "BuildRunnerKind",
    "BuildSpec",
    "CalibrationSpec",
    "DeployKind",
    "DeploySpec",
    "DraftModelSpec",
    "DraftQuantizeSpec",
    "MAX_DRAFT_LEN_CAP",
    "GPUModel",
    "GateEndpoint",
    "GateSpec",
    "GemmPlugin",
    "GoodputSpec",
    "InstanceCounts",
    "KVCacheQuant",
    "KVCacheType",
    "LatencyLimits",
    "LookaheadSpec",
    "LoraAdapterSource",
    "LoraSpec",
    "LoraTargetModule",
    "ModelDType",
    "ModelSpec",
    "PerformanceGateSpec",
    "PluginDType",
    "PluginSpec",
    "PromptLookupSpec",
    "QuantAlgo",
    "QuantDevice",
    "QuantizeSpec",
    "SchedulerPolicy",
    "GuidedDecodingBackend",
    "ServeLoraSpec",
    "ServeSpec",
    "Spec",
    "SpeculativeMode",
    "SpeculativeSpec",
    "Target",
    "lookahead_max_draft_len",
]


class Spec(StrictModel):
    """One build config: a model, how to quantize, build, serve and deploy it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Name of this build; artifacts go under <artifacts>/<name>/.")
    model: ModelSpec = Field(description="The model to build.")
    quantize: QuantizeSpec = Field(default_factory=QuantizeSpec, description="Quantization with NVIDIA ModelOpt.")
    build: BuildSpec = Field(description="Engine build settings.")
    serve: ServeSpec = Field(default_factory=ServeSpec, description="Triton model-repository settings.")
    deploy: DeploySpec = Field(default_factory=DeploySpec, description="Deployment settings; deploy.kind chooses how it is rendered and started.")
    gate: GateSpec = Field(default_factory=GateSpec, description="Pass/fail gates: accuracy between build and package, performance between package and deploy.")

    @property
    def dry_run(self) -> bool:
        """A run whose build.runner is dry-run (on a target that builds through the runner): it renders commands and
        configs without weights, GPU or TensorRT-LLM."""
        return traits_of(self.build.target).builds_through_runner and self.build.runner is BuildRunnerKind.dry_run

    @model_validator(mode="after")
    def _cross_section(self) -> Spec:
        check_cross_section(self)
        return self

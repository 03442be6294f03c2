"""The llmapi target (TensorRT-LLM's PyTorch backend): its quantize stage exports the unified Hugging Face
checkpoint; building, a Triton repository and a deployment are not available in this version."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.backends.base import BuildJob, BuiltEngine
from pipeline.backends.engine_facts import EngineFacts
from pipeline.config.model_checks import Issue
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import ServeSpec, Spec, SpeculativeSpec, Target
from pipeline.config.targets import traits_of
from pipeline.errors import StageError


class LlmapiBackend:
    target = Target.llmapi
    traits = traits_of(Target.llmapi)
    serves_here = False
    llm_model = None
    compose = None

    def preflight(self, spec: Spec, model: ModelInfo) -> list[Issue]:
        return [(
            ("build", "target"),
            f"build.target {self.target.value!r} is not available in this version yet; "
            "use target cpu or engine, or run with --until quantize to stop at the TensorRT-LLM checkpoint",
        )]

    def build(self, job: BuildJob) -> dict[str, Any]:
        raise StageError(f"build.target {self.target.value!r} is not available in this version")  # preflight refuses it first

    def llm_parameters(
        self, facts: EngineFacts, serve: ServeSpec, *, engine_dir: str, gpu_device_ids: Sequence[int], speculative: SpeculativeSpec | None
    ) -> dict[str, str]:
        raise StageError(f"build.target {self.target.value!r} has no Triton model repository in this version")

    def server_image(self, spec: Spec) -> tuple[str, str] | None:
        return None

    def check_serving_host(self, spec: Spec, built: BuiltEngine) -> None:
        return None  # `serve` refuses the target itself (serves_here)


BACKEND = LlmapiBackend()

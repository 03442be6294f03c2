"""What the spec and the plan know about each build target, below the backends that do the work.

The plan (and the config) cannot import `pipeline.backends` (ARCHITECTURE.md §4: the flow points
down to config), yet a target decides what some digests hash. Those few facts are data, here; every
other target fact and operation is the target's backend (`pipeline.backends.registry.backend_for`),
which carries these traits too.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.spec import Target


@dataclass(frozen=True)
class TargetTraits:
    # build.runner (local / docker / dry-run) runs its build, and its quantize job on quantize.device cuda
    builds_through_runner: bool
    # the build's choices depend on deploy.gpu (SM-dependent kernels), so the build digest hashes it
    build_reads_gpu: bool
    # the quantize job also exports ModelOpt's unified Hugging Face checkpoint (TensorRT-LLM's PyTorch backend reads it)
    exports_unified_hf: bool


TARGET_TRAITS: dict[Target, TargetTraits] = {
    Target.engine: TargetTraits(builds_through_runner=True, build_reads_gpu=True, exports_unified_hf=False),
    Target.cpu: TargetTraits(builds_through_runner=False, build_reads_gpu=False, exports_unified_hf=False),
    Target.llmapi: TargetTraits(builds_through_runner=False, build_reads_gpu=False, exports_unified_hf=True),
}


def traits_of(target: Target) -> TargetTraits:
    return TARGET_TRAITS[target]

"""`plan --gpu`: the capacity planner's table for a loaded spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from pipeline.backends.registry import backend_for
from pipeline.config.loader import LoadedConfig

if TYPE_CHECKING:
    from pipeline.backends.capacity import DraftModel
    from pipeline.config.spec import Spec


def print_capacity(loaded: LoadedConfig, *, gpu: str, tp: int | None, console: Console) -> None:
    """`plan --gpu`: weights and KV cache per GPU for the spec (and its draft model, if any)."""
    from pipeline.backends.capacity import capacity_table, plan_capacity

    spec = loaded.spec
    max_seq_len = spec.build.max_seq_len or loaded.model.default_max_seq_len()
    reserve_gb, memory_model = backend_for(spec.build.target).capacity_reserve(spec)
    capacity = plan_capacity(
        loaded.model,
        quant_algo=spec.quantize.algo.value,
        kv_cache_dtype=spec.quantize.kv_cache.value,
        gpu=gpu,
        max_seq_len=max_seq_len,
        max_batch_size=spec.build.max_batch_size,
        tp=tp or spec.build.tp_size,
        kv_cache_free_gpu_mem_fraction=spec.serve.kv_cache_free_gpu_mem_fraction,
        tokens_per_block=spec.build.tokens_per_block,
        group_size=spec.quantize.group_size,
        draft=_draft_for_capacity(spec),
        reserve_gb=reserve_gb,
        windows=_runtime_windows(loaded),
    )
    console.print(capacity_table(capacity))
    console.print(f"memory model: {memory_model}", markup=False)


def _runtime_windows(loaded: LoadedConfig) -> tuple[int | None, ...]:
    """The model's per-layer windows where the target's runtime keeps them (else every layer holds every token)."""
    from pipeline.config.families import family_of

    family = family_of(loaded.model.model_type)
    return loaded.model.layer_windows if family is not None and family.runtime_windows(loaded.spec.build.target) else ()


def _draft_for_capacity(spec: Spec) -> DraftModel | None:
    """build.speculative.draft as the capacity planner counts it (its weights and its own KV cache), or None."""
    from pipeline.backends.capacity import DraftModel
    from pipeline.config.model_info import read_model_info
    from pipeline.config.spec.draft import draft_spec

    draft = draft_spec(spec)
    if draft is None:
        return None
    model = read_model_info(draft.model.source)
    return DraftModel(model, draft.quantize.algo.value, draft.quantize.kv_cache.value, draft.build.max_seq_len or model.default_max_seq_len())

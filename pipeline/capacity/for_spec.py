"""The capacity planner applied to a spec: its sizes, formats and GPUs (`spec_capacity`), and the Python-model
instance counts that keep pace with that GPU (`planned_python_instances`), for `plan --gpu` and the package stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.backends.registry import backend_for
from pipeline.capacity.planner import CapacityPlan, CapacityRequest, DraftModel, plan_capacity
from pipeline.capacity.streams import python_instances, token_roofline
from pipeline.config.effective_quantization import effective_quantize
from pipeline.config.gpus import get_gpu
from pipeline.config.model_info import ModelInfo
from pipeline.config.targets import traits_of

if TYPE_CHECKING:
    from pipeline.config.spec import Spec

PYTHON_MODELS = ("preprocessing", "postprocessing", "bls")  # serve.instances fields the planner can fill


def spec_capacity(spec: Spec, model: ModelInfo, *, gpu: str, tp: int | None = None, with_draft: bool = True) -> CapacityPlan:
    """plan_capacity for `spec` on `gpu` (TP `tp`, default build.tp_size), its draft model's weights and KV included."""
    reserve_gb, _ = backend_for(spec.build.target).capacity_reserve(spec)
    quantize = effective_quantize(spec, model.path)  # a published checkpoint counts at its own format
    return plan_capacity(
        CapacityRequest(
            model,
            quant_algo=quantize.algo.value,
            kv_cache_dtype=quantize.kv_cache.value,
            gpu=get_gpu(gpu),
            max_seq_len=spec.build.max_seq_len or model.default_max_seq_len(),
            max_batch_size=spec.build.max_batch_size,
            tp=tp or spec.build.tp_size,
            kv_cache_free_gpu_mem_fraction=spec.serve.kv_cache_free_gpu_mem_fraction,
            tokens_per_block=spec.build.tokens_per_block,
            group_size=quantize.group_size,
            draft=draft_for_capacity(spec) if with_draft else None,
            reserve_gb=reserve_gb,
            windows=runtime_windows(spec, model),
        )
    )


def runtime_windows(spec: Spec, model: ModelInfo) -> tuple[int | None, ...]:
    """The model's per-layer windows where the target's runtime keeps them (else every layer holds every token)."""
    from pipeline.config.families import family_of

    family = family_of(model.model_type)
    return model.layer_windows if family is not None and family.runtime_windows(spec.build.target) else ()


def draft_for_capacity(spec: Spec) -> DraftModel | None:
    """build.speculative.draft as the capacity planner counts it (its weights and its own KV cache), or None."""
    from pipeline.config.model_info import read_model_info
    from pipeline.config.spec.draft import draft_spec

    draft = draft_spec(spec)
    if draft is None:
        return None
    model = read_model_info(draft.model.source)
    return DraftModel(model, draft.quantize.algo.value, draft.quantize.kv_cache.value, draft.build.max_seq_len or model.default_max_seq_len())


def planned_python_instances(spec: Spec, model: ModelInfo) -> tuple[dict[str, int], list[str]]:
    """serve.instances of preprocessing, postprocessing and the BLS: the spec's where it sets them, else the planner's
    (the GPU's roofline token rate ÷ one instance's measured rate) on a target whose GPU streams (deploy.gpu named),
    else 1; and the reasoning, one line per model."""
    given = {name: getattr(spec.serve.instances, name) for name in PYTHON_MODELS}
    if all(count is not None for count in given.values()):
        return dict(given), [f"serve.instances.{name}: {count} (set in the spec)" for name, count in given.items()]
    rate, why = None, ""
    if not traits_of(spec.build.target).streams_at_gpu_pace:
        why = f"build.target {spec.build.target.value}: its engine streams far below one instance's rate"
    elif spec.deploy.gpu is None:
        why = "no deploy.gpu: the GPU's token rate is unknown"
    else:
        roofline = token_roofline(spec_capacity(spec, model, gpu=spec.deploy.gpu.value, with_draft=False))
        if roofline is None:
            why = f"{spec.deploy.gpu.value}: no bandwidth or TFLOPS figure for a token rate"
        else:
            rate = roofline.tokens_per_s
    serve = spec.serve
    plans = (
        {
            plan.model: plan
            for plan in python_instances(rate, stream_interval=serve.stream_interval, batched_postprocessing=serve.postprocessing_dynamic_batching)
        }
        if rate
        else {}
    )
    counts, lines = {}, []
    for name in PYTHON_MODELS:
        if given[name] is not None:
            counts[name], source = given[name], "set in the spec"
        elif name in plans:
            counts[name], source = plans[name].instances, plans[name].reasoning
        else:
            counts[name], source = 1, f"1: {why}"
        lines.append(f"serve.instances.{name}: {counts[name]} ({source})")
    return counts, lines

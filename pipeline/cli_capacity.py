"""`plan --gpu`: the capacity planner's tables for a loaded spec: memory, the GPU's token rate, the Python models."""

from __future__ import annotations

from rich.console import Console

from pipeline.backends.registry import backend_for
from pipeline.config.loader import LoadedConfig


def print_capacity(loaded: LoadedConfig, *, gpu: str, tp: int | None, console: Console) -> None:
    """`plan --gpu`: weights and KV cache per GPU for the spec (and its draft model, if any), the streamed tokens/s
    that GPU produces, and the Python-model instances and CPU cores that keep pace with it."""
    from pipeline.capacity.for_spec import spec_capacity
    from pipeline.capacity.planner import capacity_table
    from pipeline.capacity.streams import python_instances, stream_table, token_roofline

    spec = loaded.spec
    _, memory_model = backend_for(spec.build.target).capacity_reserve(spec)
    capacity = spec_capacity(spec, loaded.model, gpu=gpu, tp=tp)
    console.print(capacity_table(capacity))
    console.print(f"memory model: {memory_model}", markup=False)
    roofline = token_roofline(capacity)
    if roofline is None:
        console.print(f"streamed tokens/s: n/a ({capacity.gpu.name} has no bandwidth or TFLOPS figure in the planner's GPU table)", markup=False)
        return
    plans = python_instances(
        roofline.tokens_per_s,
        osl=roofline.osl,
        stream_interval=spec.serve.stream_interval,
        batched_postprocessing=spec.serve.postprocessing_dynamic_batching,
    )
    console.print(stream_table(capacity, roofline, plans))
    for plan in plans:
        console.print(f"{plan.model}: {plan.reasoning}", markup=False)

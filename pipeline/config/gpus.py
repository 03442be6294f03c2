"""The GPUs the capacity planner knows, and the memory the engine keeps beside the weights and the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import SpecError

RUNTIME_RESERVE_GB = 5.0  # activations, CUDA context, TensorRT workspace (the planner's assumption)
ENGINE_MEMORY_MODEL = "engine: KV = kv_cache_free_gpu_mem_fraction × (GPU memory − weights − a 5 GB activation/runtime reserve)"


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float  # memory the planner budgets (torch `total_memory`, decimal GB)
    compute_capability: int  # SM as an integer: 90 for 9.0
    bandwidth_tbps: float | None  # datasheet HBM/GDDR bandwidth
    bf16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    source: str


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            "H200",
            150.11,
            90,
            4.8,
            989.0,
            1979.0,
            "datasheet 141 GB / 4.8 TB/s, dense = half the 2:4-sparse figures; memory = measured torch total_memory 150,109,880,320 B",
        ),
        GpuSpec(
            "H100-80GB",
            85.0,
            90,
            3.35,
            989.0,
            1979.0,
            "datasheet 80 GB, 3.35 TB/s; same compute die as H200, so the same dense TFLOPS; memory ≈ torch total_memory of an 80 GiB card [inf]",
        ),
        GpuSpec("A100-80GB", 85.0, 80, 2.04, None, None, "[inf] not measured here: 80 GiB HBM2e, 2.04 TB/s (SXM datasheet); no FP8"),
        GpuSpec("L40S", 48.0, 89, 0.864, None, None, "[inf] not measured here: 48 GB GDDR6, 864 GB/s (datasheet)"),
        GpuSpec("B200", 191.5, 100, 8.0, None, None, "[inf] not measured here: ≈180 GiB HBM3e, 8 TB/s (datasheet)"),
    )
}


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    if isinstance(name, GpuSpec):
        return name
    for key, gpu in GPUS.items():
        if key.lower() == str(name).strip().lower():
            return gpu
    raise SpecError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")

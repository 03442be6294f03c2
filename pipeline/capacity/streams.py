"""How many streamed tokens/s a GPU produces (its roofline), and how many Python-model instances keep pace with it.

The GPU's rate (a roofline, below) for a reference shape of ISL/OSL 128/128, the shape of NVIDIA's highest
published output rate (27,911 tokens/s for Llama-3.1-8B FP8 on one H200, NVIDIA/TensorRT-LLM
docs/source/performance/perf-overview.md at commit 00f37686): it is the shape that streams the most tokens per
second through preprocessing, postprocessing and the BLS, so it sizes them for the worst case. B sequences decode
together (the engine's max_batch_size, or fewer if the KV cache holds fewer of ISL + OSL tokens); one step costs
max(weights read + B × (ISL + OSL/2) KV tokens read ÷ HBM bandwidth, 2 × parameters read × B ÷ dense FLOP/s) and
each request's prefill 2 × parameters × ISL ÷ FLOP/s, so tokens/s = 1 ÷ (step ÷ B + prefill ÷ OSL). Datasheet
bandwidth and dense TFLOPS: an upper bound (NVIDIA's published rates reach 60–75 % of this compute ceiling on short
shapes: 27.9 k of 46.7 k tokens/s at 8B 128/128), which sizes the Python side with room to spare.

Python instances: each needed rate ÷ what one instance sustains on a core of its own, measured by
`trtllm-pipeline bench capacity` (the constants below, recorded with their run in BENCHMARKS.md, "The Python
models keep pace with a GPU"): postprocessing and the BLS per streamed response (a token at stream_interval 1,
N tokens at N), preprocessing per request (one per OSL tokens). One instance is one process busy on one core at
most, so the cores are the instances' share of their load, rounded up per model; tritonserver's own work per
streamed token (routing, the gRPC stream) is counted apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.capacity.planner import CapacityPlan
from pipeline.quant_formats import WEIGHT_FORMATS

REFERENCE_ISL = 128
REFERENCE_OSL = 128
MEASURED_IN = 'BENCHMARKS.md, "The Python models keep pace with a GPU (issue #34)"'


@dataclass(frozen=True)
class InstanceRate:
    """What one instance of a Python model sustains on a core of its own (bench capacity, stream_interval 1)."""

    model: str  # the serve.instances field
    per_instance: float
    unit: str  # "responses/s" or "requests/s"


# bench capacity (--rate max and --rate 100, stream_interval 1) on a 2-core EPYC VM shared with other jobs, 2026-12-03: one
# instance on a core of its own is 1 ÷ its CPU per streamed response (a lower bound: a quiet core does more)
MEASURED = (
    InstanceRate("preprocessing", 1_370.0, "requests/s"),
    InstanceRate("postprocessing", 6_200.0, "responses/s"),
    InstanceRate("bls", 4_000.0, "responses/s"),
)
BATCHED_POSTPROCESSING = InstanceRate("postprocessing", 17_600.0, "responses/s")  # serve.postprocessing_dynamic_batching
# tritonserver's own CPU per streamed response through the ensemble, measured beside the Python stand-in, whose responses
# reach it over the Python backend's IPC (a C++ tensorrt_llm's do not): an upper bound
TRITONSERVER_CPU_S_PER_RESPONSE = 0.27e-3


@dataclass(frozen=True)
class TokenRoofline:
    tokens_per_s: float
    batch: int
    step_s: float
    bound: str  # "memory bandwidth" or "compute"
    prefill_s: float  # per request
    isl: int
    osl: int


@dataclass(frozen=True)
class InstancePlan:
    model: str
    needed: float  # responses/s or requests/s at the GPU's rate
    unit: str
    per_instance: float
    instances: int
    cores: float
    reasoning: str


def token_roofline(plan: CapacityPlan, *, isl: int = REFERENCE_ISL, osl: int = REFERENCE_OSL) -> TokenRoofline | None:
    """The streamed tokens/s of `plan`'s GPUs at ISL/OSL; None when the GPU table has no bandwidth or FLOP/s for it."""
    gpu = plan.gpu
    tflops = gpu.fp8_dense_tflops if WEIGHT_FORMATS[plan.quant_algo].eight_bit_gemm else gpu.bf16_dense_tflops
    if not gpu.bandwidth_tbps or not tflops or not plan.read_bytes_per_step:
        return None
    flops_per_token = 2.0 * (plan.params.read_per_token + plan.params.embedding) / plan.tp  # decoder + output projection
    batch = max(1, min(plan.max_batch_size, plan.kv_tokens // (isl + osl)))
    memory_s = (plan.read_bytes_per_step + batch * (isl + osl / 2) * plan.kv_bytes_per_token) / (gpu.bandwidth_tbps * 1e12)
    compute_s = flops_per_token * batch / (tflops * 1e12)
    step_s = max(memory_s, compute_s)
    prefill_s = flops_per_token * isl / (tflops * 1e12)
    return TokenRoofline(
        tokens_per_s=1.0 / (step_s / batch + prefill_s / osl),
        batch=batch,
        step_s=step_s,
        bound="memory bandwidth" if memory_s >= compute_s else "compute",
        prefill_s=prefill_s,
        isl=isl,
        osl=osl,
    )


def python_instances(tokens_per_s: float, *, osl: int = REFERENCE_OSL, stream_interval: int = 1, batched_postprocessing: bool = False) -> list[InstancePlan]:
    """Instances of preprocessing, postprocessing (`batched_postprocessing`: with dynamic batching) and the BLS that keep
    pace with `tokens_per_s` streamed tokens."""
    plans = []
    for rate in MEASURED:
        if batched_postprocessing and rate.model == BATCHED_POSTPROCESSING.model:
            rate = BATCHED_POSTPROCESSING
        if rate.unit == "requests/s":
            needed, per = tokens_per_s / osl, f"{tokens_per_s:,.0f} tokens/s ÷ {osl} tokens per request"
        else:
            needed, per = tokens_per_s / stream_interval, f"{tokens_per_s:,.0f} tokens/s ÷ stream_interval {stream_interval}"
        instances = max(1, math.ceil(needed / rate.per_instance))
        plans.append(
            InstancePlan(
                model=rate.model,
                needed=needed,
                unit=rate.unit,
                per_instance=rate.per_instance,
                instances=instances,
                cores=needed / rate.per_instance,
                reasoning=f"{per} = {needed:,.0f} {rate.unit}; one instance sustains {rate.per_instance:,.0f} ({MEASURED_IN}) → {instances}",
            )
        )
    return plans


def stream_table(plan: CapacityPlan, roofline: TokenRoofline, instances: list[InstancePlan]) -> Any:
    """A rich Table for `plan --gpu`: the GPU's streamed tokens/s and the Python models that keep pace with it."""
    from rich.table import Table

    table = Table(title=f"streamed tokens/s · ISL/OSL {roofline.isl}/{roofline.osl} · {plan.tp} × {plan.gpu.name} · Python models")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("GPU tokens/s (roofline)", f"{roofline.tokens_per_s:,.0f}"),
        (f"decoding batch / step ({roofline.bound} bound)", f"{roofline.batch} / {roofline.step_s * 1000:.2f} ms"),
        ("prefill per request", f"{roofline.prefill_s * 1000:.2f} ms"),
    ]
    for entry in instances:
        rows.append((f"{entry.model} instances (each {entry.per_instance:,.0f} {entry.unit})", f"{entry.instances} ({entry.cores:.1f} cores busy)"))
    python_cores = sum(entry.cores for entry in instances if entry.model != "bls")  # the ensemble's path; the BLS's is the alternative
    rows += [
        ("CPU cores: ensemble path (pre + post)", f"{python_cores:.1f}"),
        ("CPU cores: BLS path (pre + BLS)", f"{sum(entry.cores for entry in instances if entry.model != 'postprocessing'):.1f}"),
        ("CPU cores: tritonserver's routing (at most)", f"{roofline.tokens_per_s * TRITONSERVER_CPU_S_PER_RESPONSE:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    table.caption = "roofline: datasheet bandwidth and dense TFLOPS (an upper bound); instances: " + MEASURED_IN
    return table

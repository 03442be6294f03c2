"""A load generator for served LLMs: closed-loop concurrency or open-loop request rate, against
Triton (gRPC / HTTP streaming) or an OpenAI-compatible endpoint, with per-request TTFT,
inter-token latency and end-to-end latency, and goodput under SLO limits.

    targets = make_target("grpc", "127.0.0.1:8001")
    run = asyncio.run(run_load(target, requests, Concurrency(8), warmup=4, duration_s=60))
    summary = summarize(run, SloLimits(ttft_ms=500, itl_ms=50))

Depends only on the served contract (clients/), like the rest of the clients.
"""

from clients.load.driver import Concurrency, LoadRun, RequestRate, run_load
from clients.load.records import LoadRequest, RequestRecord
from clients.load.summary import SloLimits, percentile, summarize
from clients.load.targets import ENDPOINTS, LoadTarget, make_target

__all__ = [
    "ENDPOINTS",
    "Concurrency",
    "LoadRequest",
    "LoadRun",
    "LoadTarget",
    "RequestRate",
    "RequestRecord",
    "SloLimits",
    "make_target",
    "percentile",
    "run_load",
    "summarize",
]

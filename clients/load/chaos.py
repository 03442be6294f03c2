"""Chaos traffic: concurrent streams that clients cut off, as production traffic does.

Streams go to Triton over gRPC (`ModelStreamInfer`) and HTTP SSE (`generate_stream`), to the
ensemble and to the BLS, and to the OpenAI front end (`/v1/completions`, SSE). A random share of
them is cut: after a few responses, or before the first one (during the prompt's prefill). A
gRPC cut cancels the request on the server (with `grpc_cut="stop"`, a cut ensemble stream is ended by a `stop`
to `tensorrt_llm` instead, clients/aio_stop.py); an HTTP or OpenAI cut closes the connection.
Sampled (temperature 0.8, top-k 40) with output lengths drawn from a range, so requests are
in every phase when they are cut.

    outcome = asyncio.run(run_chaos(ChaosPlan(requests=120, concurrency=8), ChaosTargets(grpc_url, http_url)))
    outcome.failed == 0

A request that was not cut and did not finish with its final response counts as failed; so
does any error on a cut request other than the cut itself. Depends only on the served contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from clients.aio import AsyncTritonLLMClient
from clients.client import ProtocolName
from clients.errors import ClientError
from clients.sse import openai_events

TRITON_ENDPOINTS: tuple[ProtocolName, ...] = ("grpc", "http")
BLS_MODEL = "tensorrt_llm_bls"  # calls tensorrt_llm with request ids of its own: a stop by the client's would find nothing
STOP_MODEL = "tensorrt_llm"
DEFAULT_PROMPTS = ("def __init__(self", "import", "class Parser", "for line in", "return self.")
_MAX_ERRORS_KEPT = 20


@dataclass(frozen=True)
class ChaosPlan:
    """`requests` sent in all, or as many as fit in `duration_s` (whichever is given; both: the first reached)."""

    requests: int | None = 100
    duration_s: float | None = None
    concurrency: int = 8
    cut_fraction: float = 0.5
    endpoints: tuple[str, ...] = ("grpc", "http", "openai")
    triton_models: tuple[str, ...] = ("ensemble", BLS_MODEL)
    max_tokens: tuple[int, int] = (16, 200)
    cut_after: tuple[int, int] = (0, 10)  # responses read before the cut; 0: before the first one
    temperature: float = 0.8
    top_k: int = 40
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    seed: int = 0
    grpc_cut: str = "cancel"  # or "stop": a `stop` to tensorrt_llm ends a cut gRPC ensemble stream

    def __post_init__(self) -> None:
        if self.requests is None and self.duration_s is None:
            raise ValueError("a chaos run needs requests or duration_s")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 0.0 <= self.cut_fraction <= 1.0:
            raise ValueError(f"cut_fraction must be between 0 and 1, got {self.cut_fraction}")
        unknown = set(self.endpoints) - {*TRITON_ENDPOINTS, "openai"}
        if not self.endpoints or unknown:
            raise ValueError(f"endpoints must be some of grpc, http, openai; got {', '.join(self.endpoints) or 'none'}")
        if not self.triton_models:
            raise ValueError("triton_models must name at least one model")
        if self.grpc_cut not in ("cancel", "stop"):
            raise ValueError(f"grpc_cut must be 'cancel' or 'stop', got {self.grpc_cut!r}")
        for name, (low, high) in (("max_tokens", self.max_tokens), ("cut_after", self.cut_after)):
            if not 0 <= low <= high:
                raise ValueError(f"{name} must be a range low <= high, got {low}..{high}")
        if self.max_tokens[0] < 1:
            raise ValueError("max_tokens must start at 1 or more")


@dataclass(frozen=True)
class ChaosTargets:
    grpc_url: str
    http_url: str
    openai_url: str | None = None  # base URL of the OpenAI front end (…/v1 added if missing)
    openai_model: str | None = None


@dataclass
class ChaosOutcome:
    done: int = 0
    cut: int = 0
    failed: int = 0
    by_route: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str | None = None  # why the run was stopped early (`run_chaos`'s `stop_reason`)

    @property
    def sent(self) -> int:
        return self.done + self.cut + self.failed

    def count(self, route: str, result: str, error: str | None = None) -> None:
        setattr(self, result, getattr(self, result) + 1)
        counts = self.by_route.setdefault(route, {"done": 0, "cut": 0, "failed": 0})
        counts[result] += 1
        if error is not None and len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(f"{route}: {error}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "done": self.done,
            "cut": self.cut,
            "failed": self.failed,
            "seconds": round(self.seconds, 2),
            "by_route": self.by_route,
            "errors": self.errors,
            "stopped": self.stopped,
        }


@dataclass(frozen=True)
class _Request:
    route: str  # "grpc:ensemble", "http:tensorrt_llm_bls", "openai"
    prompt: str
    max_tokens: int
    cut_after: int | None  # None: read to the end


class _Cut(Exception):
    pass


async def run_chaos(plan: ChaosPlan, targets: ChaosTargets, *, stop_reason: Callable[[], str | None] = lambda: None) -> ChaosOutcome:
    """Run the plan. `stop_reason` is asked every second; once it names a reason (say, the server
    died) the streams still open are abandoned, uncounted, and the outcome says why it stopped."""
    if "openai" in plan.endpoints and not (targets.openai_url and targets.openai_model):
        raise ValueError("the openai endpoint needs ChaosTargets.openai_url and openai_model")
    rng = random.Random(plan.seed)
    outcome = ChaosOutcome()
    clients: dict[tuple[str, str], AsyncTritonLLMClient] = {
        (protocol, model): AsyncTritonLLMClient(
            targets.grpc_url if protocol == "grpc" else targets.http_url,
            protocol,
            model,
            timeout=300.0,
            retries=0,
            stop_model=STOP_MODEL if plan.grpc_cut == "stop" and model != BLS_MODEL else None,
        )
        for protocol in TRITON_ENDPOINTS
        if protocol in plan.endpoints
        for model in plan.triton_models
    }
    openai = httpx.AsyncClient(timeout=300.0, limits=httpx.Limits(max_connections=None)) if "openai" in plan.endpoints else None
    started = time.monotonic()
    deadline = None if plan.duration_s is None else started + plan.duration_s
    issued = 0

    def next_request() -> _Request | None:
        nonlocal issued
        if plan.requests is not None and issued >= plan.requests:
            return None
        if deadline is not None and time.monotonic() >= deadline:
            return None
        issued += 1
        endpoint = rng.choice(plan.endpoints)
        route = "openai" if endpoint == "openai" else f"{endpoint}:{rng.choice(plan.triton_models)}"
        cut = rng.random() < plan.cut_fraction
        return _Request(route, rng.choice(plan.prompts), rng.randint(*plan.max_tokens), rng.randint(*plan.cut_after) if cut else None)

    async def caller(index: int) -> None:
        caller_rng = random.Random(plan.seed * 1000 + index)
        while (request := next_request()) is not None:
            try:
                if request.route == "openai" and openai is not None:  # openai routes exist only with the client
                    await _openai_stream(openai, targets, plan, request, caller_rng)
                else:
                    protocol, model = request.route.split(":", 1)
                    await _triton_stream(clients[(protocol, model)], plan, request, caller_rng)
            except _Cut:
                outcome.count(request.route, "cut")
            except Exception as error:  # every failure is counted and kept, the run goes on
                outcome.count(request.route, "failed", f"{type(error).__name__}: {error}"[:300])
            else:
                outcome.count(request.route, "done")

    callers = [asyncio.ensure_future(caller(index)) for index in range(plan.concurrency)]
    try:
        while not all(task.done() for task in callers):
            await asyncio.wait(callers, timeout=1.0)
            if outcome.stopped is None and (reason := stop_reason()) is not None:
                outcome.stopped = reason
                for task in callers:
                    task.cancel()
        await asyncio.gather(*callers, return_exceptions=outcome.stopped is not None)
    finally:
        for client in clients.values():
            await client.close()
        if openai is not None:
            await openai.aclose()
    outcome.seconds = time.monotonic() - started
    return outcome


async def _triton_stream(client: AsyncTritonLLMClient, plan: ChaosPlan, request: _Request, rng: random.Random) -> None:
    if request.cut_after == 0:
        await _cut_early(_triton_read(client, plan, request), rng)
    await _triton_read(client, plan, request)


async def _triton_read(client: AsyncTritonLLMClient, plan: ChaosPlan, request: _Request) -> None:
    stream = client.stream(request.prompt, max_tokens=request.max_tokens, temperature=plan.temperature, top_k=plan.top_k)
    async with stream:
        responses = 0
        async for _ in stream:
            responses += 1
            if request.cut_after and responses >= request.cut_after:
                stream.cancel()
                raise _Cut
    if request.cut_after:
        raise _Cut  # it ended before the cut point: counted as cut, as the client meant it


async def _openai_stream(http: httpx.AsyncClient, targets: ChaosTargets, plan: ChaosPlan, request: _Request, rng: random.Random) -> None:
    if request.cut_after == 0:
        await _cut_early(_openai_read(http, targets, plan, request), rng)
    await _openai_read(http, targets, plan, request)


async def _openai_read(http: httpx.AsyncClient, targets: ChaosTargets, plan: ChaosPlan, request: _Request) -> None:
    base = (targets.openai_url or "").rstrip("/")
    url = f"{base if base.endswith('/v1') else base + '/v1'}/completions"
    body = {
        "model": targets.openai_model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": plan.temperature,
        "top_k": plan.top_k,
        "stream": True,
    }
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode('utf-8', 'replace')[:200]}")
        events = 0
        async for _ in openai_events(response.aiter_lines()):
            events += 1
            if request.cut_after and events >= request.cut_after:
                raise _Cut  # leaving the block closes the connection mid-stream
    if request.cut_after:
        raise _Cut


async def _cut_early(read: Coroutine[Any, Any, None], rng: random.Random) -> None:
    """Give the request 0-30 ms (its prompt is usually still in prefill), then cut it: the task is
    cancelled, which cancels the gRPC call or closes the connection."""
    task = asyncio.ensure_future(read)
    await asyncio.sleep(rng.random() * 0.03)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, _Cut, ClientError, httpx.HTTPError):
        await task
    raise _Cut

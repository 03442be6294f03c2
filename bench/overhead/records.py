"""The overhead benchmark's records: what to measure (`OverheadOptions`), what was loaded in this
process to compare with (`InProcessSetup`), and what the server sitting gave (`ServerSitting`)."""

from __future__ import annotations

import dataclasses
from typing import Any

DEFAULT_PROMPT = "def foo(x):\n    return"
STREAM_TOKENS = 64


@dataclasses.dataclass(frozen=True)
class OverheadOptions:
    """Part (1): `requests` 1-token requests per path after `warmup`, with `concurrency` callers per
    path (closed loop; `engine.generate` has one caller by nature). Part (2): `stream_requests`
    requests of `stream_tokens` tokens per path after `stream_warmup`, one caller. Each part runs in
    interleaved rounds (`rounds`, `stream_rounds`). `torch_threads` (default 1, as the engine bench)
    sets torch's intra-op threads on both sides: OMP_NUM_THREADS for the server (its stubs inherit
    it) and `torch.set_num_threads` here, restored afterwards. On a small shared machine one thread
    keeps the engine's own time steady, so the differences are Triton's; None measures as deployed
    (torch's default thread count on both sides). `include_bls` adds the `tensorrt_llm_bls` paths."""

    requests: int = 200
    warmup: int = 20
    concurrency: int = 1
    stream_tokens: int = STREAM_TOKENS
    stream_requests: int = 32
    stream_warmup: int = 3
    rounds: int = 4
    stream_rounds: int = 4
    prompt: str = DEFAULT_PROMPT
    include_bls: bool = True
    torch_threads: int | None = 1
    startup_timeout: float = 180.0
    sweep: tuple[int, ...] = ()  # part (4): concurrent streams per point (empty: not run)
    sweep_requests: int = 8  # part (4): requests per path and point, at least (and 2 per caller)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.requests < 1 or self.stream_requests < 1 or self.stream_tokens < 2:
            raise ValueError("concurrency, requests and stream_requests must be >= 1, stream_tokens >= 2")

    def counts(self) -> dict[str, Any]:
        """The request counts, as the recipe records them."""
        return {
            "requests": self.requests,
            "warmup": self.warmup,
            "concurrency": self.concurrency,
            "rounds": self.rounds,
            "stream_tokens": self.stream_tokens,
            "stream_requests": self.stream_requests,
            "stream_warmup": self.stream_warmup,
            "stream_rounds": self.stream_rounds,
            "include_bls": self.include_bls,
            "sweep": list(self.sweep),
            "sweep_requests": self.sweep_requests,
        }


@dataclasses.dataclass(frozen=True)
class InProcessSetup:
    """The served repository's tokenizer code and the engine with the served settings, in this process."""

    tok: Any  # paths.Tokenizer
    engine: Any  # refengine.LLMEngine for `engine.generate`
    loop_engine: Any  # a second one, for the EngineLoop (no lock sharing)
    engine_settings: dict[str, Any]
    prompt_ids: list[int]
    expected: dict[int, str]  # max_tokens → the in-process greedy text every path must give


@dataclasses.dataclass(frozen=True)
class ServerSitting:
    """What one tritonserver sitting measured and how it ended."""

    single: dict[str, Any]  # path name → its tally of part (1)
    streamed: dict[str, Any]  # path name → its tally of part (2)
    swept: dict[int, dict[str, Any]]  # part (4): callers → path name → tally
    server_options: Any  # pipeline.serve.ServerOptions, on free loopback ports
    startup_s: float
    server_version: str | None
    engine_metrics_at_end: dict[str, float]
    returncode: int | None
    process_group_left: bool

"""Engine settings: the build limits of the engine directory plus the runtime choices.

Limits carry TensorRT-LLM's names and meanings (`build_config`: `max_batch_size`,
`max_input_len`, `max_seq_len`, `max_num_tokens`, `max_beam_width`,
`plugin_config.tokens_per_block`); runtime choices mirror the `tensorrt_llm` Triton model's
parameters (`batch_scheduler_policy`, `enable_chunked_context`, `enable_kv_cache_reuse`).
`batching` is the Triton model's `gpt_model_type`: "inflight" (`inflight_fused_batching`) or
"static" (`V1`: a batch is held until its longest request ends).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from refengine.errors import EngineConfigError
from refengine.lora.settings import LoraSettings

COMPUTE_DTYPES = ("float32", "float16", "bfloat16")


class SchedulerPolicy(str, enum.Enum):
    """How the scheduler admits requests when KV-cache blocks are scarce."""

    GUARANTEED_NO_EVICT = "guaranteed_no_evict"  # admit only what can run to max_tokens
    MAX_UTILIZATION = "max_utilization"  # admit more; preempt (recompute) when blocks run out

    @classmethod
    def parse(cls, value: str | SchedulerPolicy) -> SchedulerPolicy:
        if isinstance(value, SchedulerPolicy):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise EngineConfigError("scheduler_policy", f"{value!r} is not one of {choices}") from None


class ContextSchedulingPolicy(str, enum.Enum):
    """The order among waiting sequences of one priority (TensorRT-LLM 1.4's `SchedulerConfig.context_scheduling_policy`)."""

    FCFS = "fcfs"  # arrival order
    SHORTEST_UNCACHED_FIRST = "shortest_uncached_first"  # fewest tokens to compute (not in the prefix cache) first

    @classmethod
    def parse(cls, value: str | ContextSchedulingPolicy) -> ContextSchedulingPolicy:
        if isinstance(value, ContextSchedulingPolicy):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise EngineConfigError("context_scheduling_policy", f"{value!r} is not one of {choices}") from None


# Steps, not seconds, so that scheduling stays deterministic. About one long generation (one token per step): a low-priority
# request waits at most that long under a flood of higher ones, while priority still reorders every shorter burst. With
# equal priorities the guard changes nothing (the oldest sequences are first anyway), so the default costs nothing.
DEFAULT_CONTEXT_STARVATION_STEPS = 1000


class BatchingMode(str, enum.Enum):
    """How requests share the batch over time."""

    INFLIGHT = "inflight"  # requests join and leave the running batch at any step
    # A batch is admitted together and held until its longest request ends; finished rows keep
    # computing padding (TensorRT-LLM's V1 / static batching, Hugging Face `generate`).
    STATIC = "static"

    @classmethod
    def parse(cls, value: str | BatchingMode) -> BatchingMode:
        if isinstance(value, BatchingMode):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise EngineConfigError("batching", f"{value!r} is not one of {choices}") from None


@dataclass(frozen=True)
class EngineConfig:
    """Limits and runtime choices of one `LLMEngine`. Validated on construction."""

    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int = 2048
    max_num_tokens: int = 512
    tokens_per_block: int = 32
    num_kv_blocks: int | None = None  # None: enough for max_batch_size full-length sequences
    scheduler_policy: SchedulerPolicy = SchedulerPolicy.GUARANTEED_NO_EVICT
    enable_chunked_context: bool = False
    enable_prefix_caching: bool = False
    max_num_samples: int = 4  # upper bound of SamplingParams.n
    max_logprobs: int = 20  # upper bound of SamplingParams.logprobs
    compute_dtype: str = "float32"
    batching: BatchingMode = BatchingMode.INFLIGHT
    max_draft_len: int = 0  # speculative decoding: draft tokens per step (0: built without it)
    max_beam_width: int = 1  # upper bound of SamplingParams.beam_width
    # TensorRT-LLM's stream_interval (LlmArgs): a request's output on its first decoding step, on every
    # stream_interval-th one after, and when it finishes; the steps between add their tokens to the next one.
    stream_interval: int = 1
    # fp16 weights computed in float32 run on fbgemm's fp16-weight GEMM (products accumulated in float32: the same
    # weights, another summation order; about half the decode step's cost). False: float32 GEMMs, results bit for bit
    # those of F.linear on the float32 weights (model_runner/linear.py, DenseLinear).
    fp16_weight_gemm: bool = True
    # The LoRA cache's sizes and the modules LoRA may adapt (refengine/lora/settings.py).
    lora: LoraSettings = LoraSettings()
    # Priority scheduling (refengine/scheduler/admission_order.py). A sequence older than this many scheduler steps is
    # admitted ahead of higher-priority ones and no longer preempted for them (TensorRT-LLM 1.4's
    # context_starvation_iterations); 0: off.
    context_starvation_steps: int = DEFAULT_CONTEXT_STARVATION_STEPS
    context_scheduling_policy: ContextSchedulingPolicy = ContextSchedulingPolicy.FCFS

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheduler_policy", SchedulerPolicy.parse(self.scheduler_policy))
        object.__setattr__(self, "batching", BatchingMode.parse(self.batching))
        object.__setattr__(self, "context_scheduling_policy", ContextSchedulingPolicy.parse(self.context_scheduling_policy))
        if self.batching is BatchingMode.STATIC and self.scheduler_policy is not SchedulerPolicy.GUARANTEED_NO_EVICT:
            raise EngineConfigError(
                "batching",
                "static batching holds every row until its batch ends, so it cannot preempt: "
                f"it needs scheduler_policy guaranteed_no_evict, not {self.scheduler_policy.value}",
            )
        for name in (
            "max_batch_size",
            "max_input_len",
            "max_seq_len",
            "max_num_tokens",
            "tokens_per_block",
            "max_num_samples",
            "max_beam_width",
            "stream_interval",
        ):
            _require_positive_int(name, getattr(self, name))
        if self.num_kv_blocks is not None:
            _require_positive_int("num_kv_blocks", self.num_kv_blocks)
        if isinstance(self.max_draft_len, bool) or not isinstance(self.max_draft_len, int) or self.max_draft_len < 0:
            raise EngineConfigError("max_draft_len", f"must be a non-negative integer, got {self.max_draft_len!r}")
        if self.max_draft_len and self.batching is BatchingMode.STATIC:
            raise EngineConfigError("batching", "speculative decoding (max_draft_len > 0) runs with inflight batching only")
        if isinstance(self.context_starvation_steps, bool) or not isinstance(self.context_starvation_steps, int) or self.context_starvation_steps < 0:
            raise EngineConfigError("context_starvation_steps", f"must be a non-negative integer (0: off), got {self.context_starvation_steps!r}")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise EngineConfigError("max_logprobs", f"must be a non-negative integer, got {self.max_logprobs!r}")
        if self.max_input_len > self.max_seq_len:
            raise EngineConfigError(
                "max_input_len",
                f"{self.max_input_len} exceeds max_seq_len {self.max_seq_len}",
            )
        if not isinstance(self.fp16_weight_gemm, bool):
            raise EngineConfigError("fp16_weight_gemm", f"must be true or false, got {self.fp16_weight_gemm!r}")
        if not isinstance(self.lora, LoraSettings):
            raise EngineConfigError("lora", f"must be LoraSettings, got {type(self.lora).__name__}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise EngineConfigError("compute_dtype", f"{self.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")

    @property
    def total_kv_blocks(self) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        blocks_per_sequence = -(-self.max_seq_len // self.tokens_per_block)
        return self.max_batch_size * blocks_per_sequence

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_build_config(cls, build_config: Mapping[str, Any], **overrides: Any) -> EngineConfig:
        """Limits from an engine's `build_config` (LoRA's too, when it was built with LoRA); `overrides` set runtime choices
        (or limits)."""
        plugin_config = build_config.get("plugin_config") or {}
        values: dict[str, Any] = {}
        for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width"):
            if build_config.get(name) is not None:
                values[name] = build_config[name]
        if plugin_config.get("tokens_per_block") is not None:
            values["tokens_per_block"] = plugin_config["tokens_per_block"]
        lora = LoraSettings.from_build_config(build_config)
        if lora is not None:
            values["lora"] = lora
        values.update(overrides)
        return cls(**values)


def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EngineConfigError(name, f"must be a positive integer, got {value!r}")

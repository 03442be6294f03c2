"""The spec's gate section: the accuracy gate (between build and package) and the performance gate (between package and deploy)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from pipeline.config.spec.choices import GateEndpoint
from pipeline.config.spec.strict import StrictModel


class AccuracyGateSpec(StrictModel):
    heldout_files: tuple[str, ...] = Field(
        min_length=1,
        description="Held-out text files (glob patterns, relative to the YAML file) the quantized model is scored on.",
    )
    num_windows: int = Field(default=16, ge=1, le=10_000, description="Token windows scored (spread evenly over the held-out text).")
    window_len: int = Field(default=256, ge=16, le=32_768, description="Tokens per scored window.")
    max_perplexity_increase_pct: float = Field(
        default=5.0, ge=0.0, description="Largest allowed perplexity increase of the quantized model over the unquantized baseline, in percent."
    )
    min_token_agreement: float = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="Smallest allowed fraction of positions where the quantized and baseline models predict the same next token (teacher-forced).",
    )
    baseline: Path | None = Field(
        default=None,
        description="The unquantized checkpoint the quantized model is scored against (a local directory, relative to the "
        "YAML file like model.source). Needed when model.source is a pre-quantized checkpoint served as published "
        "(docs/prequantized.md), whose quantized codes are no baseline: e.g. the BF16 original it was quantized from. "
        "Unset: model.source itself.",
    )


class LatencyLimits(StrictModel):
    p50: float | None = Field(default=None, gt=0, description="Largest allowed median, in milliseconds.")
    p90: float | None = Field(default=None, gt=0, description="Largest allowed 90th percentile, in milliseconds.")
    p99: float | None = Field(default=None, gt=0, description="Largest allowed 99th percentile, in milliseconds.")

    @model_validator(mode="after")
    def _some_limit(self) -> LatencyLimits:
        if self.p50 is None and self.p90 is None and self.p99 is None:
            raise ValueError("set at least one of p50, p90, p99")
        return self


class GoodputSpec(StrictModel):
    ttft_ms: float | None = Field(default=None, gt=0, description="A good request's time to first token is at most this (ms).")
    itl_ms: float | None = Field(default=None, gt=0, description="A good request's mean inter-token latency is at most this (ms).")
    e2e_ms: float | None = Field(default=None, gt=0, description="A good request's end-to-end latency is at most this (ms).")
    min_pct: float = Field(ge=0.0, le=100.0, description="Smallest allowed share of requests that meet every limit above, in percent.")

    @model_validator(mode="after")
    def _some_limit(self) -> GoodputSpec:
        if self.ttft_ms is None and self.itl_ms is None and self.e2e_ms is None:
            raise ValueError("set at least one of ttft_ms, itl_ms, e2e_ms")
        return self


class PerformanceGateSpec(StrictModel):
    endpoint: GateEndpoint = Field(default=GateEndpoint.grpc, description="What the load goes through: Triton grpc or http streaming, or the openai front end.")
    url: str | None = Field(
        default=None,
        description="Measure this running deployment (engine target: Triton host:port, or the OpenAI base URL) instead of "
        "serving the packaged repository with the bundled tritonserver (cpu target).",
    )
    concurrency: int = Field(default=4, ge=1, le=4096, description="Concurrent streaming callers (closed loop).")
    num_requests: int = Field(default=32, ge=1, le=1_000_000, description="Requests measured, after the warm-up requests.")
    warmup_requests: int = Field(default=4, ge=0, le=10_000, description="Requests sent first and not measured.")
    input_tokens: int = Field(
        default=128,
        ge=1,
        description="Synthetic prompt length in tokens (windows of the bundled held-out text); at most build.max_input_len, "
        "and input_tokens + output_tokens at most build.max_seq_len.",
    )
    output_tokens: int = Field(default=64, ge=1, description="Tokens every request generates (min_tokens = max_tokens).")
    seed: int = Field(default=0, ge=0, description="Seed of the synthetic workload.")
    max_ttft_ms: LatencyLimits | None = Field(default=None, description="Time-to-first-token percentile limits (ms).")
    max_itl_ms: LatencyLimits | None = Field(default=None, description="Inter-token-latency percentile limits (ms).")
    max_e2e_ms: LatencyLimits | None = Field(default=None, description="End-to-end latency percentile limits (ms).")
    min_output_tokens_per_s: float | None = Field(
        default=None, gt=0, description="Smallest allowed output throughput at this concurrency, in tokens per second."
    )
    min_requests_per_s: float | None = Field(default=None, gt=0, description="Smallest allowed request throughput at this concurrency, in requests per second.")
    goodput: GoodputSpec | None = Field(default=None, description="Per-request SLO limits and the share of requests that must meet them.")
    max_regression_pct: float | None = Field(
        default=None,
        ge=0.0,
        description="Fail when TTFT/ITL p99 rose, or output throughput fell, by more than this percent against the last stored "
        "result of this build name (the regression is reported either way).",
    )

    @model_validator(mode="after")
    def _some_threshold(self) -> PerformanceGateSpec:
        thresholds = (
            self.max_ttft_ms,
            self.max_itl_ms,
            self.max_e2e_ms,
            self.min_output_tokens_per_s,
            self.min_requests_per_s,
            self.goodput,
            self.max_regression_pct,
        )
        if all(value is None for value in thresholds):
            raise ValueError(
                "set at least one threshold: max_ttft_ms, max_itl_ms, max_e2e_ms, min_output_tokens_per_s, min_requests_per_s, goodput or max_regression_pct"
            )
        return self


class GateSpec(StrictModel):
    accuracy: AccuracyGateSpec | None = Field(
        default=None, description="Accuracy gate: stop the pipeline when quantization costs more than these thresholds (evaluated on CPU with refengine)."
    )
    performance: PerformanceGateSpec | None = Field(
        default=None,
        description="Performance (SLO) gate: load-test the packaged model and stop before deploy when latency or throughput misses these thresholds.",
    )

"""The spec's serve section: the Triton model repository's settings."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.spec.choices import GuidedDecodingBackend, SchedulerPolicy
from pipeline.config.spec.strict import StrictModel

_PLANNED = (
    " Unset: planned by the package stage, on a target that streams at a GPU's pace with deploy.gpu named, from the "
    "GPU's token rate ÷ one instance's measured rate (`plan --gpu` shows the reasoning); else 1."
)


class InstanceCounts(StrictModel):
    preprocessing: int | None = Field(default=None, ge=1, le=64, description="Tokenizer model instances." + _PLANNED)
    tensorrt_llm: int = Field(default=1, ge=1, le=16, description="LLM model instances.")
    postprocessing: int | None = Field(default=None, ge=1, le=64, description="Detokenizer model instances." + _PLANNED)
    bls: int | None = Field(default=None, ge=1, le=64, description="tensorrt_llm_bls model instances." + _PLANNED)


class ServeLoraSpec(StrictModel):
    """The LoRA cache (Triton lora_cache_* parameters; llmapi: LLM()'s peft_cache_config); only with build.lora."""

    cache_optimal_adapter_size: int = Field(
        default=8, ge=1, le=1024, description="lora_cache_optimal_adapter_size: the rank cache pages are sized for (the most common adapter rank)."
    )
    cache_max_adapter_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="lora_cache_max_adapter_size: the largest rank the cache holds. Default: build.lora.max_rank; it may not be smaller.",
    )
    cache_gpu_memory_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, description="lora_cache_gpu_memory_fraction: share of the GPU memory left after the engine and KV cache."
    )
    cache_host_memory_bytes: int = Field(default=1 << 30, ge=0, description="lora_cache_host_memory_bytes: host cache for adapters (default 1 GiB).")
    prefetch_dir: str | None = Field(
        default=None,
        description="lora_prefetch_dir: adapters loaded when the model starts, one folder per task id "
        "(<dir>/<task_id>/model.lora_weights.npy + model.lora_config.npy, as `trtllm-pipeline lora convert` writes them); "
        "a path on the serving host, relative to this file.",
    )

    @model_validator(mode="after")
    def _sizes(self) -> ServeLoraSpec:
        if self.cache_max_adapter_size is not None and self.cache_optimal_adapter_size > self.cache_max_adapter_size:
            raise ValueError(
                f"serve.lora.cache_optimal_adapter_size ({self.cache_optimal_adapter_size}) exceeds "
                f"serve.lora.cache_max_adapter_size ({self.cache_max_adapter_size})"
            )
        return self


class ServeSpec(StrictModel):
    model_name: str = Field(default="ensemble", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name clients call (the ensemble model).")
    streaming: bool = Field(default=True, description="Allow streaming responses (gRPC streaming, HTTP generate_stream).")
    decoupled: bool = Field(default=True, description="Triton decoupled transaction policy for the LLM model; required for streaming.")
    instances: InstanceCounts = Field(default_factory=InstanceCounts, description="Model instance counts.")
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of free memory (after the engine loads) given to the KV cache."
    )
    enable_kv_cache_reuse: bool = Field(default=True, description="Reuse KV blocks of identical prompt prefixes; needs paged context FMHA in the engine.")
    enable_chunked_context: bool = Field(default=True, description="Split long prompts across iterations; needs paged context FMHA in the engine.")
    batch_scheduler_policy: SchedulerPolicy = Field(default=SchedulerPolicy.guaranteed_no_evict, description="guaranteed_no_evict or max_utilization.")
    exclude_input_in_output: bool = Field(default=True, description="Return only generated tokens, not the prompt.")
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=1024,
        description=(
            "Streamed requests get a response on their first decoding step, then every stream_interval-th step, and the last "
            "(TensorRT-LLM's LLM API stream_interval). 1: every token. Larger values cut the serving stack's CPU per streamed "
            "token about that many times (BENCHMARKS.md); time to first token is unchanged. cpu and llmapi targets; the "
            "engine target's tensorrtllm C++ backend has no such parameter and streams every token."
        ),
    )
    postprocessing_dynamic_batching: bool = Field(
        default=False,
        description=(
            "Triton dynamic batching for the postprocessing model: one execution (and one batched tokenizer call) serves "
            "every streamed response waiting, which cuts its CPU per token several times under concurrency "
            "(BENCHMARKS.md, issue #34). Off by default: Triton's batcher answers a cancelled stream's postprocessing "
            "requests itself (every release through r26.06), so postprocessing never stops the generation of a stream "
            "whose client cancelled the call: it runs to max_tokens, and before r26.03 (the bundled 2.51 included; core "
            "#466) the ensemble request never ends. Streams ended by a stop to the LLM model instead (the OpenAI front end "
            "on an ensemble, clients.aio with stop_model) are not affected, nor is the BLS (tensorrt_llm_bls), which "
            "decodes in itself."
        ),
    )
    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=10_000_000, description="Dynamic-batching queue delay.")
    max_queue_size: int = Field(default=0, ge=0, description="Maximum queued requests (0 = unlimited).")
    guided_decoding: GuidedDecodingBackend = Field(
        default=GuidedDecodingBackend.xgrammar,
        description=(
            "Structured output (JSON schema, regex, EBNF grammar guides): xgrammar, or none (a guided request is refused). "
            "xgrammar renders guided_decoding_backend and the tokenizer-info file; unguided requests pay nothing for it."
        ),
    )
    lora: ServeLoraSpec | None = Field(
        default=None,
        description="LoRA cache sizes (needs build.lora): the tensorrt_llm model's lora_cache_* parameters, or on the llmapi "
        "target peft_cache_config (optimal_adapter_size, max_adapter_size, device_cache_percent, host_cache_size). "
        "Absent with build.lora: the defaults.",
    )

    @model_validator(mode="after")
    def _streaming_needs_decoupled(self) -> ServeSpec:
        if self.streaming and not self.decoupled:
            raise ValueError("serve.streaming: true requires serve.decoupled: true (Triton streams only from decoupled models)")
        return self

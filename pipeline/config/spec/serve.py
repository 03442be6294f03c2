"""The spec's serve section: the Triton model repository's settings."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.spec.choices import GuidedDecodingBackend, SchedulerPolicy
from pipeline.config.spec.strict import StrictModel
from pipeline.config.spec.traffic import TrafficSpec
from pipeline.config.targets import Target, traits_of

# The targets whose instance counts the package stage plans, read from the target traits.
_GPU_PACED = " and ".join(t.value for t in Target if traits_of(t).streams_at_gpu_pace)
_PLANNED = (
    f" Unset: on the {_GPU_PACED} target with deploy.gpu named, the package stage plans enough instances to keep pace "
    "with that GPU's token rate (see BENCHMARKS.md; `plan --gpu` shows the reasoning); otherwise 1."
)


class InstanceCounts(StrictModel):
    preprocessing: int | None = Field(default=None, ge=1, le=64, description="Triton instances of the preprocessing (tokenizer) model." + _PLANNED)
    tensorrt_llm: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Triton instances of the LLM model (tensorrt_llm). On the engine target each takes build.tp_size × "
        "build.pp_size GPUs, all listed in deploy.gpus where it is set; the llmapi target refuses more than 1.",
    )
    postprocessing: int | None = Field(default=None, ge=1, le=64, description="Triton instances of the postprocessing (detokenizer) model." + _PLANNED)
    bls: int | None = Field(default=None, ge=1, le=64, description="Triton instances of the tensorrt_llm_bls model." + _PLANNED)


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
    cache_host_memory_bytes: int = Field(
        default=1 << 30, ge=0, description="lora_cache_host_memory_bytes: host memory for cached adapters, in bytes (default 1 GiB)."
    )
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
    model_name: str = Field(
        default="ensemble",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Name of the ensemble model, the one clients call. The llmapi target refuses a change (its one model is tensorrt_llm).",
    )
    streaming: bool = Field(default=True, description="Allow streaming responses (gRPC streaming, HTTP generate_stream); needs serve.decoupled.")
    decoupled: bool = Field(default=True, description="Triton decoupled transaction policy for the LLM model; required for streaming.")
    instances: InstanceCounts = Field(default_factory=InstanceCounts, description="Model instance counts.")
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of the GPU memory still free after the engine loads that the KV cache takes."
    )
    enable_kv_cache_reuse: bool = Field(
        default=True,
        description="Reuse the KV-cache blocks of identical prompt prefixes across requests. Needs build.plugins.context_fmha "
        "and use_paged_context_fmha; required with build.speculative.mode draft_tokens_external.",
    )
    enable_chunked_context: bool = Field(
        default=True,
        description="Split long prompts into chunks processed over several iterations. Needs build.plugins.context_fmha and use_paged_context_fmha.",
    )
    batch_scheduler_policy: SchedulerPolicy = Field(
        default=SchedulerPolicy.guaranteed_no_evict,
        description="How requests are admitted to a batch: guaranteed_no_evict (only when the KV cache can hold the "
        "request to its end) or max_utilization (as many as fit, pausing some when the cache runs out).",
    )
    exclude_input_in_output: bool = Field(
        default=True,
        description="Return only the generated tokens, not the prompt. The llmapi target refuses false (a request asks for "
        "the prompt with sampling_param_exclude_input_from_output).",
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=1024,
        description=(
            "Streamed requests get a response on their first decoding step, then on every stream_interval-th step and with "
            "their last token (TensorRT-LLM's LLM API stream_interval); 1 sends every token. Larger values cut the serving "
            "stack's CPU per streamed token about that many times and leave time to first token unchanged (see "
            "BENCHMARKS.md). cpu and llmapi targets; the engine target refuses values above 1 (its tensorrtllm C++ backend "
            "streams every token)."
        ),
    )
    postprocessing_dynamic_batching: bool = Field(
        default=False,
        description=(
            "Triton dynamic batching for the postprocessing model: one execution (and one batched tokenizer call) serves "
            "every streamed response waiting, which cuts its CPU per token several times under concurrency (see "
            "BENCHMARKS.md), and the instance planner counts that rate. Off by default because Triton's batcher (in every "
            "release up to r26.06) answers a cancelled stream's postprocessing requests itself, so a stream whose client "
            "cancels the call generates on to max_tokens, and on Triton before r26.03 (the bundled 2.51 included) its "
            "ensemble request never ends (docs/serving.md). Unaffected: streams ended by a stop to the LLM model (the "
            "OpenAI front end on an ensemble, clients.aio with stop_model) and the BLS (tensorrt_llm_bls), which decodes "
            "in itself; the llmapi target refuses it (it has no postprocessing model)."
        ),
    )
    max_queue_delay_microseconds: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Triton dynamic batching's max_queue_delay_microseconds for the preprocessing, LLM and BLS models (and "
        "postprocessing with serve.postprocessing_dynamic_batching): how long a request may wait for a fuller batch, in "
        "microseconds; 0: no wait. The llmapi target refuses a change (LLM() batches, not Triton).",
    )
    max_queue_size: int = Field(
        default=0,
        ge=0,
        description="Triton's max_queue_size for the preprocessing, LLM and BLS models: requests queued beyond it are "
        "refused; 0: unlimited. The llmapi target refuses a change (LLM() batches, not Triton).",
    )
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
    traffic: TrafficSpec | None = Field(
        default=None,
        description="Traffic classes: priorities, TTFT/TPOT objectives, queue bounds and shares per class, and the classes of "
        "each API key (docs/traffic-classes.md). Unset: one class, first come first served.",
    )

    @model_validator(mode="after")
    def _streaming_needs_decoupled(self) -> ServeSpec:
        if self.streaming and not self.decoupled:
            raise ValueError("serve.streaming: true requires serve.decoupled: true (Triton streams only from decoupled models)")
        return self

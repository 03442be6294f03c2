"""The spec's build section: the engine's sizes, plugins, parallelism, LoRA and speculative decoding."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from pipeline.config.spec.choices import BuildRunnerKind, GemmPlugin, KVCacheType, LoraAdapterSource, LoraTargetModule, PluginDType
from pipeline.config.spec.speculative import SpeculativeSpec
from pipeline.config.spec.strict import StrictModel
from pipeline.config.targets import Target, traits_of
from pipeline.quant_formats import FP8_MIN_SM, WEIGHT_FORMATS

# Format facts the field descriptions below state, read from the format registry.
_FP8_CONTEXT_FMHA_QUANT = "/".join(str(f.trtllm_quant_algo) for f in WEIGHT_FORMATS.values() if f.fp8_context_fmha)
_FUSED_MLP_WEIGHTS = " or ".join([str(f.trtllm_quant_algo) for f in WEIGHT_FORMATS.values() if f.fused_mlp and f.quantized] + ["unquantized"])
# The targets build.runner applies to, read from the target traits.
_RUNNER_TARGETS = " and ".join(t.value for t in Target if traits_of(t).builds_through_runner)


class PluginSpec(StrictModel):
    """trtllm-build plugin and fusion switches, with TensorRT-LLM 1.2 defaults."""

    gpt_attention_plugin: PluginDType = Field(
        default=PluginDType.auto, description="--gpt_attention_plugin; required for paged KV cache and inflight batching."
    )
    gemm_plugin: GemmPlugin = Field(default=GemmPlugin.disable, description="--gemm_plugin for non-quantized (and FP8) GEMMs.")
    context_fmha: bool = Field(default=True, description="--context_fmha; disabling it also disables paged and FP8 context FMHA.")
    use_paged_context_fmha: bool = Field(default=True, description="--use_paged_context_fmha; needed for KV-cache reuse and chunked context.")
    use_fp8_context_fmha: bool = Field(
        default=True, description=f"--use_fp8_context_fmha; effective only with {_FP8_CONTEXT_FMHA_QUANT} quantization on SM >= {FP8_MIN_SM}."
    )
    use_fused_mlp: bool = Field(default=True, description=f"--use_fused_mlp; fuses gate and up projections ({_FUSED_MLP_WEIGHTS} only).")
    remove_input_padding: bool = Field(default=True, description="--remove_input_padding; packed token batches.")
    reduce_fusion: bool = Field(default=False, description="--reduce_fusion; only takes effect with tp_size > 1 on Llama.")
    multiple_profiles: bool = Field(default=False, description="--multiple_profiles; more TensorRT optimization profiles, longer build.")


class LoraSpec(StrictModel):
    """LoRA adapters (engine: trtllm-build --lora_plugin and the --lora_* flags; llmapi: LLM()'s lora_config)."""

    adapter_dirs: tuple[str, ...] = Field(
        default=(),
        description="Hugging Face PEFT adapter directories (adapter_config.json + adapter_model.safetensors), relative to "
        "the YAML file; the first defines the LoRA configuration, validate checks each against the model (modules, "
        "tensor shapes, rank), and a dry run needs only adapter_config.json. The build puts them at <engine>/lora/<i>/ "
        "(engine: trtllm-build --lora_dir; llmapi: linked there for lora_config.lora_dir). Clients select an adapter per "
        "request: lora_task_id / lora_weights / lora_config (engine, cpu), lora_id / lora_name / lora_path or "
        "trtllm-serve's lora_request (llmapi).",
    )
    adapter_source: LoraAdapterSource = Field(
        default=LoraAdapterSource.hf,
        description="--lora_ckpt_source: hf (PEFT directories). nemo is refused: a .nemo LoRA archive holds pickled "
        "torch weights, which this project does not load (see model.source).",
    )
    target_modules: tuple[LoraTargetModule, ...] = Field(
        default=(),
        description="--lora_target_modules, TensorRT-LLM module ids: attn_qkv (Phi-3's qkv_proj), attn_q (q_proj), attn_k "
        "(k_proj), attn_v (v_proj), attn_dense (o_proj), mlp_h_to_4h (gate_proj; Phi-3's gate_up_proj), mlp_4h_to_h "
        "(down_proj), mlp_gate (up_proj). "
        "Default: the modules of the first adapter's adapter_config.json. Every adapter's modules must be listed.",
    )
    max_rank: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="--max_lora_rank (llmapi: lora_config.max_lora_rank): the largest adapter rank the engine accepts (sizes the LoRA plugin workspace).",
    )

    @field_validator("target_modules")
    @classmethod
    def _distinct_modules(cls, value: tuple[LoraTargetModule, ...]) -> tuple[LoraTargetModule, ...]:
        names = [module.value for module in value]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"build.lora.target_modules lists {', '.join(duplicated)} more than once")
        return value

    @model_validator(mode="after")
    def _usable(self) -> LoraSpec:
        if self.adapter_source is LoraAdapterSource.nemo:
            raise ValueError(
                "build.lora.adapter_source nemo is refused: a .nemo LoRA archive holds pickled torch weights "
                "(model_weights.ckpt), which can run code when loaded; convert the adapter to a Hugging Face PEFT "
                "directory with adapter_model.safetensors and use adapter_source hf"
            )
        if not self.adapter_dirs and not self.target_modules:
            raise ValueError(
                "build.lora.target_modules is empty and build.lora.adapter_dirs lists no adapter to read them from: the "
                "engine would have the LoRA plugin but no LoRA inputs; list the modules (e.g. [attn_q, attn_k, attn_v, attn_dense])"
            )
        names = [str(Path(d)) for d in self.adapter_dirs]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"build.lora.adapter_dirs lists {', '.join(duplicated)} more than once")
        return self


class BuildSpec(StrictModel):
    target: Target = Field(description="engine (TensorRT-LLM on a GPU), cpu (the reference engine, runs anywhere) or llmapi (TensorRT-LLM PyTorch backend).")
    trtllm_version: str = Field(
        default="1.2.1",
        description="TensorRT-LLM version profile: engine target (trtllm-build flags, defaults, pinned Triton image) 1.2.1, 1.1.0 or "
        "1.0.0; llmapi target (the LLM() options it accepts, Triton and trtllm-serve images) 1.2.1.",
    )
    runner: BuildRunnerKind = Field(
        default=BuildRunnerKind.local,
        description=f"Where the GPU jobs of the {_RUNNER_TARGETS} targets run (trtllm-build, and the quantize job with "
        "quantize.device cuda): local (this host's tools), docker (the version profile's pinned Triton TRT-LLM image) or "
        "dry-run (write the commands and configs only; no GPU or weights needed). `run --runner` overrides it.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="trtllm-build --workers: ranks built in parallel (at most the world size). The llmapi target refuses a change.",
    )
    max_batch_size: int = Field(default=2048, ge=1, le=65_536, description="Maximum requests scheduled per iteration.")
    max_input_len: int = Field(default=1024, ge=1, description="Maximum prompt length of one request, in tokens.")
    max_seq_len: int | None = Field(
        default=None,
        ge=2,
        description="Maximum prompt + output length. Default: the model's max_position_embeddings "
        "(times the RoPE scaling factor where TensorRT-LLM applies it).",
    )
    max_num_tokens: int = Field(
        default=8192, ge=1, description="Maximum packed tokens per iteration (the per-step token budget); at least build.tokens_per_block."
    )
    opt_num_tokens: int | None = Field(
        default=None,
        ge=1,
        description="trtllm-build --opt_num_tokens: the token count the TensorRT optimization profile is tuned for. Not with "
        "build.plugins.multiple_profiles; the llmapi target refuses it.",
    )
    max_beam_width: int = Field(
        default=1, ge=1, le=64, description="Maximum beams of beam search (the cpu target runs beam search up to it); 1 with build.speculative."
    )
    tokens_per_block: int = Field(default=32, description="Tokens per paged KV-cache block: a power of two in 16..128.")
    kv_cache_type: KVCacheType = Field(
        default=KVCacheType.paged, description="paged (needed for inflight batching), continuous or disabled; the llmapi target takes only paged."
    )
    gather_context_logits: bool = Field(
        default=False,
        description="Engine target: keep the logits of every prompt token (trtllm-build --gather_context_logits), so that "
        "requests can ask for return_context_logits and the OpenAI front end can answer echo with logprobs (the prompt "
        "log-probs lm-eval's loglikelihood tasks need). It costs a float32 logits buffer of about max_num_tokens × vocab "
        "size × 4 bytes of GPU memory (4.2 GB for Llama 3's 128,256 tokens at max_num_tokens 8192) and is refused with "
        "build.speculative. The cpu target always returns them; the llmapi target refuses it (prompt log-probs are per "
        "request there).",
    )
    tp_size: int = Field(
        default=1, ge=1, le=64, description="Tensor-parallel ranks; must divide the model's number of KV heads (or be a multiple of it, replicating them)."
    )
    pp_size: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel ranks; must divide the number of layers.")
    plugins: PluginSpec = Field(
        default_factory=PluginSpec,
        description="trtllm-build plugin and fusion switches; the llmapi target refuses a change (the PyTorch backend has no plugins).",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="LoRA adapters: the LoRA plugin in the model's dtype (engine, cpu), LLM()'s lora_config (llmapi). Absent: no LoRA.",
    )
    speculative: SpeculativeSpec | None = Field(
        default=None,
        description="Speculative decoding: a draft model (draft_tokens_external), n-grams of the request's own tokens "
        "(prompt_lookup), lookahead decoding, Medusa or EAGLE heads, or the model's MTP layers (build.speculative.mode). "
        "Absent: one token per step.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> BuildSpec:
        tpb = self.tokens_per_block
        if tpb < 16 or tpb > 128 or tpb & (tpb - 1):
            raise ValueError(f"build.tokens_per_block must be a power of two in 16..128, got {tpb}")
        if self.max_seq_len is not None and self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"build.max_input_len ({self.max_input_len}) must be less than build.max_seq_len "
                f"({self.max_seq_len}): every request needs room for at least one output token"
            )
        if self.max_num_tokens < tpb:
            raise ValueError(f"build.max_num_tokens ({self.max_num_tokens}) must be at least build.tokens_per_block ({tpb})")
        if self.speculative is not None and self.max_beam_width > 1:
            raise ValueError(
                f"build.max_beam_width ({self.max_beam_width}) must be 1 with build.speculative (mode "
                f"{self.speculative.mode.value}): TensorRT-LLM decodes speculative engines with one beam (its "
                "draft-target and prompt-lookup examples refuse --num_beams > 1; decoding_mode lookahead and medusa exclude "
                "beam_search)"
            )
        if self.speculative is not None and self.gather_context_logits:
            raise ValueError(
                "build.gather_context_logits: true cannot be combined with build.speculative: trtllm-build refuses gather_context_logits with max_draft_len > 0"
            )
        if self.opt_num_tokens is not None and self.plugins.multiple_profiles:
            raise ValueError("build.opt_num_tokens cannot be set together with build.plugins.multiple_profiles (trtllm-build rejects the combination)")
        return self

"""The build spec: what one YAML file in `build_configs/` may say.

Every model is frozen and forbids unknown keys; every field carries a description (the README's
YAML reference and `build_configs/schema.json` are generated from them). Cross-field validators
name both fields in their messages. Checks that need the model's own `config.json` live in
`pipeline.config.model_checks`, not here, so this module stays pure.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.config.format_rules import check_format_rules
from pipeline.quant_formats import FP8_MIN_SM, WEIGHT_FORMATS


# Format facts the field descriptions below state, read from the format registry.
_UNCALIBRATED_ALGOS = " and ".join(f.name for f in WEIGHT_FORMATS.values() if not f.calibrated)
_FP8_CONTEXT_FMHA_QUANT = "/".join(str(f.trtllm_quant_algo) for f in WEIGHT_FORMATS.values() if f.fp8_context_fmha)
_FUSED_MLP_WEIGHTS = " or ".join(
    [str(f.trtllm_quant_algo) for f in WEIGHT_FORMATS.values() if f.fused_mlp and f.quantized] + ["unquantized"]
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=False)


class ModelDType(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"


class QuantAlgo(str, Enum):
    none = "none"
    fp8 = "fp8"
    int8_sq = "int8_sq"
    int8_wo = "int8_wo"
    int4_awq = "int4_awq"
    w4a8_awq = "w4a8_awq"
    nvfp4 = "nvfp4"


class KVCacheQuant(str, Enum):
    none = "none"
    fp8 = "fp8"
    int8 = "int8"


class QuantDevice(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Target(str, Enum):
    engine = "engine"
    cpu = "cpu"
    llmapi = "llmapi"


class KVCacheType(str, Enum):
    paged = "paged"
    continuous = "continuous"
    disabled = "disabled"


class PluginDType(str, Enum):
    auto = "auto"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    disable = "disable"


class GemmPlugin(str, Enum):
    auto = "auto"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    fp8 = "fp8"
    nvfp4 = "nvfp4"
    disable = "disable"


class BuildRunnerKind(str, Enum):
    local = "local"
    docker = "docker"
    dry_run = "dry-run"


class DeployKind(str, Enum):
    compose = "compose"


class GPUModel(str, Enum):
    h100_80gb = "H100-80GB"
    h200 = "H200"
    l40s = "L40S"
    a100_80gb = "A100-80GB"
    b200 = "B200"


class LoraTargetModule(str, Enum):
    """TensorRT-LLM LoRA module ids (LoraManager.LORA_MODULE_IDS) of a dense decoder; Hugging Face PEFT name in the comment."""

    attn_qkv = "attn_qkv"  # fused q/k/v (no PEFT equivalent in Llama checkpoints)
    attn_q = "attn_q"  # q_proj
    attn_k = "attn_k"  # k_proj
    attn_v = "attn_v"  # v_proj
    attn_dense = "attn_dense"  # o_proj
    mlp_h_to_4h = "mlp_h_to_4h"  # gate_proj
    mlp_4h_to_h = "mlp_4h_to_h"  # down_proj
    mlp_gate = "mlp_gate"  # up_proj


class LoraAdapterSource(str, Enum):
    hf = "hf"
    nemo = "nemo"


class SpeculativeMode(str, Enum):
    """trtllm-build --speculative_decoding_mode choices (TensorRT-LLM 1.2)."""

    lookahead_decoding = "lookahead_decoding"
    draft_tokens_external = "draft_tokens_external"
    medusa = "medusa"
    eagle = "eagle"
    explicit_draft_tokens = "explicit_draft_tokens"


# What this pipeline cannot produce for each refused mode (it exports plain Llama-family checkpoints with ModelOpt
# and serves one tensorrt_llm model behind the ensemble / its own BLS).
_UNSUPPORTED_SPECULATIVE_MODES = {
    "draft_tokens_external": "needs a second (draft) engine and a BLS model that sends its draft tokens to the target "
    "(tensorrt_llm_draft_model_name); this pipeline builds and serves one model, so the target engine would never receive "
    "draft tokens",
    "medusa": "needs a Medusa checkpoint (the base model plus trained Medusa heads, converted by TensorRT-LLM's "
    "examples/medusa/convert_checkpoint.py); this pipeline exports plain checkpoints with ModelOpt and cannot produce one",
    "eagle": "needs an EAGLE checkpoint (the base model plus a trained EAGLE draft layer, converted by TensorRT-LLM's "
    "examples/eagle/convert_checkpoint.py); this pipeline exports plain checkpoints with ModelOpt and cannot produce one",
    "explicit_draft_tokens": "(ReDrafter) needs a ReDrafter checkpoint with its trained recurrent drafter; this pipeline "
    "exports plain checkpoints with ModelOpt and cannot produce one",
}


def lookahead_max_draft_len(window_size: int, ngram_size: int, verification_set_size: int) -> int:
    """Draft tokens a lookahead (W, N, G) configuration needs: TensorRT-LLM's
    LookaheadDecodingConfig::calculateSpeculativeResourceTuple (maxDraftTokens), which examples/lookahead/README.md
    says the engine's --max_draft_len must equal."""
    first = 0 if ngram_size == 1 else ngram_size - 2
    return first + (window_size - 1 + verification_set_size) * (ngram_size - 1)


class SchedulerPolicy(str, Enum):
    guaranteed_no_evict = "guaranteed_no_evict"
    max_utilization = "max_utilization"


class ModelSpec(_Strict):
    source: Path = Field(
        description="Local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files). "
        "Relative paths are resolved against the YAML file's directory. Safetensors only: pickled "
        "checkpoints (.bin/.pt) are refused. Nothing is downloaded."
    )
    dtype: ModelDType = Field(
        default=ModelDType.float16,
        description="Data type of the non-quantized parts of the exported TensorRT-LLM checkpoint.",
    )
    copy_weights: bool = Field(
        default=False,
        description="Copy the weights into the artifact store (a reflink where the file system can make one), making "
        "the prepare artifact self-contained. Default: the store records the source's weight files by content hash and "
        "the stages read them from model.source, re-checked at every read; configs and tokenizer files are always "
        "copied. The store never links into the source, so nothing written there reaches your checkpoint.",
    )


class CalibrationSpec(_Strict):
    files: tuple[str, ...] = Field(
        default=(),
        description="Local text or JSONL files (glob patterns, relative to the YAML file) whose text calibrates "
        f"quantization. Required for every algo except {_UNCALIBRATED_ALGOS}.",
    )
    num_samples: int = Field(default=64, ge=1, le=100_000, description="Number of token windows used for calibration.")
    max_seq_len: int = Field(default=256, ge=8, le=32_768, description="Tokens per calibration window.")
    batch_size: int = Field(default=8, ge=1, le=1024, description="Calibration windows per forward pass.")
    seed: int = Field(default=0, ge=0, description="Seed for choosing calibration windows.")


class QuantizeSpec(_Strict):
    algo: QuantAlgo = Field(
        default=QuantAlgo.none,
        description="Weight/activation quantization: none, fp8, int8_sq (SmoothQuant W8A8), int8_wo (INT8 "
        "weight-only), int4_awq (W4A16 AWQ), w4a8_awq, nvfp4 (engine target on a CUDA machine only). "
        "INT4 weight-only is not offered: ModelOpt 0.47 exports it as W4A16_AWQ without the prequant_scaling_factor "
        "tensors that format declares, so TensorRT-LLM may not load it; use int4_awq.",
    )
    kv_cache: KVCacheQuant = Field(default=KVCacheQuant.none, description="KV-cache quantization: none, fp8 or int8.")
    group_size: int = Field(default=128, description="Group size along the input dimension for AWQ formats (64 or 128).")
    device: QuantDevice = Field(default=QuantDevice.cpu, description="Where calibration runs: cpu, or cuda (through the build runner on a GPU host).")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec, description="Calibration data and its sampling.")

    @field_validator("algo", mode="before")
    @classmethod
    def _int4_weight_only_is_not_offered(cls, value: object) -> object:
        if value == "int4_wo":
            raise ValueError(
                "quantize.algo int4_wo is not offered: ModelOpt 0.47 exports INT4 weight-only as W4A16_AWQ without the "
                "prequant_scaling_factor tensors that format declares, so TensorRT-LLM may not load it; use int4_awq"
            )
        return value

    @model_validator(mode="after")
    def _group_size_choice(self) -> "QuantizeSpec":
        if self.group_size not in (64, 128):
            raise ValueError(f"quantize.group_size must be 64 or 128, got {self.group_size}")
        return self


class PluginSpec(_Strict):
    """trtllm-build plugin and fusion switches, with TensorRT-LLM 1.2 defaults."""

    gpt_attention_plugin: PluginDType = Field(default=PluginDType.auto, description="--gpt_attention_plugin; required for paged KV cache and inflight batching.")
    gemm_plugin: GemmPlugin = Field(default=GemmPlugin.disable, description="--gemm_plugin for non-quantized (and FP8) GEMMs.")
    context_fmha: bool = Field(default=True, description="--context_fmha; disabling it also disables paged and FP8 context FMHA.")
    use_paged_context_fmha: bool = Field(default=True, description="--use_paged_context_fmha; needed for KV-cache reuse and chunked context.")
    use_fp8_context_fmha: bool = Field(default=True, description=f"--use_fp8_context_fmha; effective only with {_FP8_CONTEXT_FMHA_QUANT} quantization on SM >= {FP8_MIN_SM}.")
    use_fused_mlp: bool = Field(default=True, description=f"--use_fused_mlp; fuses gate and up projections ({_FUSED_MLP_WEIGHTS} only).")
    remove_input_padding: bool = Field(default=True, description="--remove_input_padding; packed token batches.")
    reduce_fusion: bool = Field(default=False, description="--reduce_fusion; only takes effect with tp_size > 1 on Llama.")
    multiple_profiles: bool = Field(default=False, description="--multiple_profiles; more TensorRT optimization profiles, longer build.")


class LoraSpec(_Strict):
    """LoRA adapters served by the engine (trtllm-build --lora_plugin and the --lora_* flags)."""

    adapter_dirs: tuple[str, ...] = Field(
        default=(),
        description="Adapter directories (Hugging Face PEFT: adapter_config.json + adapter_model.safetensors), relative to "
        "the YAML file; trtllm-build --lora_dir copies them into <engine>/lora/<i>/, and the first one defines the "
        "configuration. A dry run needs only adapter_config.json; a build needs the weights too. Clients select an "
        "adapter per request with lora_task_id / lora_weights / lora_config.",
    )
    adapter_source: LoraAdapterSource = Field(
        default=LoraAdapterSource.hf,
        description="--lora_ckpt_source: hf (PEFT directories). nemo is refused: a .nemo LoRA archive holds pickled "
        "torch weights, which this project does not load (see model.source).",
    )
    target_modules: tuple[LoraTargetModule, ...] = Field(
        default=(),
        description="--lora_target_modules, TensorRT-LLM module ids: attn_qkv, attn_q (q_proj), attn_k (k_proj), attn_v "
        "(v_proj), attn_dense (o_proj), mlp_h_to_4h (gate_proj), mlp_4h_to_h (down_proj), mlp_gate (up_proj). "
        "Default: the modules of the first adapter's adapter_config.json. Every adapter's modules must be listed.",
    )
    max_rank: int = Field(
        default=64, ge=1, le=1024, description="--max_lora_rank: the largest adapter rank the engine accepts (sizes the LoRA plugin workspace)."
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
    def _usable(self) -> "LoraSpec":
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


class LookaheadSpec(_Strict):
    """Lookahead decoding's (W, N, G); the defaults are TensorRT-LLM's (LookaheadDecodingConfig)."""

    window_size: int = Field(default=4, ge=1, le=64, description="W: n-grams in the lookahead branch per step (Triton lookahead_window_size).")
    ngram_size: int = Field(default=3, ge=1, le=64, description="N: tokens per n-gram, the most draft tokens accepted per step (Triton lookahead_ngram_size).")
    verification_set_size: int = Field(
        default=4, ge=0, le=64, description="G: n-grams verified per step (Triton lookahead_verification_set_size)."
    )

    @model_validator(mode="after")
    def _legal(self) -> "LookaheadSpec":
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        if n == 1 and (w != 1 or g != 0):
            raise ValueError(
                f"build.speculative.lookahead.ngram_size 1 needs window_size 1 and verification_set_size 0 "
                f"(TensorRT-LLM's legality rule), got window_size {w}, verification_set_size {g}"
            )
        if lookahead_max_draft_len(w, n, g) == 0:
            raise ValueError(
                "build.speculative.lookahead (1, 1, 0) decodes one token per step (no speculation); the smallest "
                "speculative configuration is window_size 2, ngram_size 2, verification_set_size 1"
            )
        return self


class SpeculativeSpec(_Strict):
    """Speculative decoding (trtllm-build --speculative_decoding_mode / --max_draft_len)."""

    mode: SpeculativeMode = Field(
        description="lookahead_decoding (no extra model: the engine drafts n-grams itself). draft_tokens_external, medusa, "
        "eagle and explicit_draft_tokens (ReDrafter) are refused: they need a draft engine or trained draft heads this "
        "pipeline does not produce."
    )
    max_draft_len: int | None = Field(
        default=None,
        ge=1,
        description="--max_draft_len. Lookahead: derived from (W, N, G) as (N - 2 if N > 1 else 0) + (W - 1 + G) × (N - 1), "
        "which the engine and Triton's lookahead parameters must agree on; set it only to state that value.",
    )
    lookahead: LookaheadSpec = Field(default_factory=LookaheadSpec, description="Lookahead (W, N, G) for mode lookahead_decoding.")

    @model_validator(mode="after")
    def _mode_fields(self) -> "SpeculativeSpec":
        mode = self.mode.value
        if mode in _UNSUPPORTED_SPECULATIVE_MODES:
            raise ValueError(f"build.speculative.mode {mode} is refused: it {_UNSUPPORTED_SPECULATIVE_MODES[mode]}")
        if "lookahead" in self.model_fields_set and self.mode is not SpeculativeMode.lookahead_decoding:
            raise ValueError(f"build.speculative.lookahead applies to mode lookahead_decoding only, not {mode}")
        la = self.lookahead
        derived = lookahead_max_draft_len(la.window_size, la.ngram_size, la.verification_set_size)
        if self.max_draft_len is not None and self.max_draft_len != derived:
            raise ValueError(
                f"build.speculative.max_draft_len ({self.max_draft_len}) must equal the draft length of "
                f"build.speculative.lookahead (W {la.window_size}, N {la.ngram_size}, G {la.verification_set_size}) = {derived}: "
                "TensorRT-LLM requires the engine's --max_draft_len to equal the runtime's lookahead configuration"
            )
        return self

    @property
    def draft_len(self) -> int:
        """The --max_draft_len the engine is built with."""
        la = self.lookahead
        return lookahead_max_draft_len(la.window_size, la.ngram_size, la.verification_set_size)


class BuildSpec(_Strict):
    target: Target = Field(description="engine (TensorRT-LLM on a GPU), cpu (the reference engine, runs anywhere) or llmapi (TensorRT-LLM PyTorch backend).")
    trtllm_version: str = Field(default="1.2.1", description="TensorRT-LLM version profile of the engine target (flags, defaults, pinned Triton image): 1.2.1, 1.1.0 or 1.0.0.")
    runner: BuildRunnerKind = Field(
        default=BuildRunnerKind.local,
        description="Where trtllm-build runs (engine target): local (on PATH), docker (the pinned Triton TRT-LLM image) or dry-run "
        "(write the commands and configs only, no GPU or weights needed). `run --runner` overrides it.",
    )
    workers: int = Field(default=1, ge=1, le=64, description="trtllm-build --workers: ranks built in parallel (at most the world size).")
    max_batch_size: int = Field(default=2048, ge=1, le=65_536, description="Maximum requests scheduled per iteration.")
    max_input_len: int = Field(default=1024, ge=1, description="Maximum prompt length of one request, in tokens.")
    max_seq_len: int | None = Field(
        default=None,
        ge=2,
        description="Maximum prompt + output length. Default: the model's max_position_embeddings "
        "(times the RoPE scaling factor where TensorRT-LLM applies it).",
    )
    max_num_tokens: int = Field(default=8192, ge=1, description="Maximum packed tokens per iteration (the per-step token budget).")
    opt_num_tokens: int | None = Field(default=None, ge=1, description="TensorRT optimization-profile point; not allowed with plugins.multiple_profiles.")
    max_beam_width: int = Field(default=1, ge=1, le=64, description="Maximum beams (also bounds n > 1 sampling on the cpu target).")
    tokens_per_block: int = Field(default=32, description="Tokens per paged KV-cache block: a power of two in 16..128.")
    kv_cache_type: KVCacheType = Field(default=KVCacheType.paged, description="paged (needed for inflight batching), continuous or disabled.")
    gather_context_logits: bool = Field(
        default=False,
        description="Engine target: keep the logits of every prompt token (trtllm-build --gather_context_logits), so that "
        "requests can ask for return_context_logits and the OpenAI front end can answer echo with logprobs (prompt "
        "log-probs, what lm-eval's loglikelihood tasks need). Costs GPU memory for a logits buffer of about max_num_tokens "
        "× vocab size × 4 bytes (float32 logits): 4.2 GB for a Llama 3 vocabulary (128,256) at max_num_tokens 8192. "
        "Not with speculative decoding. The cpu target always returns them.",
    )
    tp_size: int = Field(default=1, ge=1, le=64, description="Tensor-parallel ranks; must divide the model's number of KV heads (or be a multiple of it, replicating them).")
    pp_size: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel ranks; must divide the number of layers.")
    plugins: PluginSpec = Field(default_factory=PluginSpec, description="Plugin and fusion switches.")
    lora: LoraSpec | None = Field(
        default=None,
        description="LoRA adapters (engine target): enables the LoRA plugin in the model's dtype. Absent: no LoRA.",
    )
    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding (engine target). Absent: one token per step."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> "BuildSpec":
        tpb = self.tokens_per_block
        if tpb < 16 or tpb > 128 or tpb & (tpb - 1):
            raise ValueError(f"build.tokens_per_block must be a power of two in 16..128, got {tpb}")
        if self.max_seq_len is not None and self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"build.max_input_len ({self.max_input_len}) must be less than build.max_seq_len "
                f"({self.max_seq_len}): every request needs room for at least one output token"
            )
        if self.max_num_tokens < tpb:
            raise ValueError(
                f"build.max_num_tokens ({self.max_num_tokens}) must be at least build.tokens_per_block ({tpb})"
            )
        if self.opt_num_tokens is not None and self.plugins.multiple_profiles:
            raise ValueError(
                "build.opt_num_tokens cannot be set together with build.plugins.multiple_profiles "
                "(trtllm-build rejects the combination)"
            )
        return self


class InstanceCounts(_Strict):
    preprocessing: int = Field(default=1, ge=1, le=64, description="Tokenizer model instances.")
    tensorrt_llm: int = Field(default=1, ge=1, le=16, description="LLM model instances.")
    postprocessing: int = Field(default=1, ge=1, le=64, description="Detokenizer model instances.")
    bls: int = Field(default=1, ge=1, le=64, description="tensorrt_llm_bls model instances.")


class ServeLoraSpec(_Strict):
    """The tensorrt_llm model's LoRA cache (Triton lora_cache_* parameters); only with build.lora."""

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

    @model_validator(mode="after")
    def _sizes(self) -> "ServeLoraSpec":
        if self.cache_max_adapter_size is not None and self.cache_optimal_adapter_size > self.cache_max_adapter_size:
            raise ValueError(
                f"serve.lora.cache_optimal_adapter_size ({self.cache_optimal_adapter_size}) exceeds "
                f"serve.lora.cache_max_adapter_size ({self.cache_max_adapter_size})"
            )
        return self


class ServeSpec(_Strict):
    model_name: str = Field(default="ensemble", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name clients call (the ensemble model).")
    streaming: bool = Field(default=True, description="Allow streaming responses (gRPC streaming, HTTP generate_stream).")
    decoupled: bool = Field(default=True, description="Triton decoupled transaction policy for the LLM model; required for streaming.")
    instances: InstanceCounts = Field(default_factory=InstanceCounts, description="Model instance counts.")
    kv_cache_free_gpu_mem_fraction: float = Field(default=0.9, gt=0.0, le=1.0, description="Fraction of free memory (after the engine loads) given to the KV cache.")
    enable_kv_cache_reuse: bool = Field(default=True, description="Reuse KV blocks of identical prompt prefixes; needs paged context FMHA in the engine.")
    enable_chunked_context: bool = Field(default=True, description="Split long prompts across iterations; needs paged context FMHA in the engine.")
    batch_scheduler_policy: SchedulerPolicy = Field(default=SchedulerPolicy.guaranteed_no_evict, description="guaranteed_no_evict or max_utilization.")
    exclude_input_in_output: bool = Field(default=True, description="Return only generated tokens, not the prompt.")
    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=10_000_000, description="Dynamic-batching queue delay.")
    max_queue_size: int = Field(default=0, ge=0, description="Maximum queued requests (0 = unlimited).")
    lora: ServeLoraSpec | None = Field(
        default=None, description="LoRA cache sizes of the tensorrt_llm model (needs build.lora). Absent with build.lora: the defaults."
    )

    @model_validator(mode="after")
    def _streaming_needs_decoupled(self) -> "ServeSpec":
        if self.streaming and not self.decoupled:
            raise ValueError("serve.streaming: true requires serve.decoupled: true (Triton streams only from decoupled models)")
        return self


class DeploySpec(_Strict):
    kind: DeployKind = Field(default=DeployKind.compose, description="How the deployment is rendered and started: compose (docker compose: Triton, Prometheus, Grafana).")
    image: str | None = Field(default=None, description="Container image. Default: the pinned Triton TRT-LLM image for engine, a Python slim image for cpu.")
    bind_address: str = Field(default="127.0.0.1", description="Address the published ports bind to (loopback by default).")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton HTTP port.")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton gRPC port.")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton Prometheus metrics port.")
    gpus: tuple[int, ...] = Field(default=(), description="GPU device ids given to the server (engine target); their number must be tp_size × pp_size × LLM instances.")
    gpu: GPUModel | None = Field(default=None, description="GPU model the engine is built for and served on; enables the compute-capability checks (e.g. FP8 needs SM >= 8.9).")
    shm_size: str = Field(default="2g", pattern=r"^[0-9]+[kmgKMG]?$", description="/dev/shm size of the server container (docker notation, e.g. 2g).")

    @model_validator(mode="after")
    def _distinct_ports(self) -> "DeploySpec":
        ports = {"deploy.http_port": self.http_port, "deploy.grpc_port": self.grpc_port, "deploy.metrics_port": self.metrics_port}
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} ({port}) is the same as {seen[port]}; each port must be distinct")
            seen[port] = name
        return self


class AccuracyGateSpec(_Strict):
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


class GateEndpoint(str, Enum):
    grpc = "grpc"
    http = "http"
    openai = "openai"


class LatencyLimits(_Strict):
    p50: float | None = Field(default=None, gt=0, description="Largest allowed median, in milliseconds.")
    p90: float | None = Field(default=None, gt=0, description="Largest allowed 90th percentile, in milliseconds.")
    p99: float | None = Field(default=None, gt=0, description="Largest allowed 99th percentile, in milliseconds.")

    @model_validator(mode="after")
    def _some_limit(self) -> "LatencyLimits":
        if self.p50 is None and self.p90 is None and self.p99 is None:
            raise ValueError("set at least one of p50, p90, p99")
        return self


class GoodputSpec(_Strict):
    ttft_ms: float | None = Field(default=None, gt=0, description="A good request's time to first token is at most this (ms).")
    itl_ms: float | None = Field(default=None, gt=0, description="A good request's mean inter-token latency is at most this (ms).")
    e2e_ms: float | None = Field(default=None, gt=0, description="A good request's end-to-end latency is at most this (ms).")
    min_pct: float = Field(ge=0.0, le=100.0, description="Smallest allowed share of requests that meet every limit above, in percent.")

    @model_validator(mode="after")
    def _some_limit(self) -> "GoodputSpec":
        if self.ttft_ms is None and self.itl_ms is None and self.e2e_ms is None:
            raise ValueError("set at least one of ttft_ms, itl_ms, e2e_ms")
        return self


class PerformanceGateSpec(_Strict):
    endpoint: GateEndpoint = Field(default=GateEndpoint.grpc, description="What the load goes through: Triton grpc or http streaming, or the openai front end.")
    url: str | None = Field(
        default=None,
        description="Measure this running deployment (engine target: Triton host:port, or the OpenAI base URL) instead of "
        "serving the packaged repository with the bundled tritonserver (cpu target).",
    )
    concurrency: int = Field(default=4, ge=1, le=4096, description="Concurrent streaming callers (closed loop).")
    num_requests: int = Field(default=32, ge=1, le=1_000_000, description="Measured requests.")
    warmup_requests: int = Field(default=4, ge=0, le=10_000, description="Requests sent first and not measured.")
    input_tokens: int = Field(default=128, ge=1, description="Synthetic prompt length in tokens (windows of the bundled held-out text).")
    output_tokens: int = Field(default=64, ge=1, description="Tokens every request generates (min_tokens = max_tokens).")
    seed: int = Field(default=0, ge=0, description="Workload seed.")
    max_ttft_ms: LatencyLimits | None = Field(default=None, description="Time-to-first-token percentile limits (ms).")
    max_itl_ms: LatencyLimits | None = Field(default=None, description="Inter-token-latency percentile limits (ms).")
    max_e2e_ms: LatencyLimits | None = Field(default=None, description="End-to-end latency percentile limits (ms).")
    min_output_tokens_per_s: float | None = Field(default=None, gt=0, description="Smallest allowed output throughput at this concurrency.")
    min_requests_per_s: float | None = Field(default=None, gt=0, description="Smallest allowed request throughput at this concurrency.")
    goodput: GoodputSpec | None = Field(default=None, description="Per-request SLO limits and the share of requests that must meet them.")
    max_regression_pct: float | None = Field(
        default=None,
        ge=0.0,
        description="Fail when TTFT/ITL p99 rose, or output throughput fell, by more than this percent against the last stored "
        "result of this build name (the regression is reported either way).",
    )

    @model_validator(mode="after")
    def _some_threshold(self) -> "PerformanceGateSpec":
        thresholds = (self.max_ttft_ms, self.max_itl_ms, self.max_e2e_ms, self.min_output_tokens_per_s, self.min_requests_per_s,
                      self.goodput, self.max_regression_pct)
        if all(value is None for value in thresholds):
            raise ValueError(
                "set at least one threshold: max_ttft_ms, max_itl_ms, max_e2e_ms, min_output_tokens_per_s, "
                "min_requests_per_s, goodput or max_regression_pct"
            )
        return self


class GateSpec(_Strict):
    accuracy: AccuracyGateSpec | None = Field(
        default=None, description="Accuracy gate: stop the pipeline when quantization costs more than these thresholds (evaluated on CPU with refengine)."
    )
    performance: PerformanceGateSpec | None = Field(
        default=None,
        description="Performance (SLO) gate: load-test the packaged model and stop before deploy when latency or throughput "
        "misses these thresholds.",
    )


class Spec(_Strict):
    """One build config: a model, how to quantize, build, serve and deploy it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Name of this build; artifacts go under <artifacts>/<name>/.")
    model: ModelSpec = Field(description="The model to build.")
    quantize: QuantizeSpec = Field(default_factory=QuantizeSpec, description="Quantization with NVIDIA ModelOpt.")
    build: BuildSpec = Field(description="Engine build settings.")
    serve: ServeSpec = Field(default_factory=ServeSpec, description="Triton model-repository settings.")
    deploy: DeploySpec = Field(default_factory=DeploySpec, description="Deployment settings; deploy.kind chooses how it is rendered and started.")
    gate: GateSpec = Field(default_factory=GateSpec, description="Pass/fail gates: accuracy between build and package, performance between package and deploy.")

    @property
    def dry_run(self) -> bool:
        """An engine-target run that renders commands and configs without weights, GPU or TensorRT-LLM."""
        return self.build.target is Target.engine and self.build.runner is BuildRunnerKind.dry_run

    @model_validator(mode="after")
    def _cross_section(self) -> "Spec":
        paged_ctx = self.build.plugins.use_paged_context_fmha and self.build.plugins.context_fmha
        for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
            if getattr(self.serve, field) and not paged_ctx:
                raise ValueError(
                    f"serve.{field}: true needs build.plugins.use_paged_context_fmha: true "
                    "(and build.plugins.context_fmha: true) in the engine"
                )
        check_format_rules(self.quantize, self.build, self.serve)
        _check_lora_and_speculative(self.build, self.serve)
        performance = self.gate.performance
        if performance is not None and performance.input_tokens > self.build.max_input_len:
            raise ValueError(
                f"gate.performance.input_tokens ({performance.input_tokens}) exceeds build.max_input_len ({self.build.max_input_len})"
            )
        if performance is not None and self.build.max_seq_len is not None and (
            performance.input_tokens + performance.output_tokens > self.build.max_seq_len
        ):
            raise ValueError(
                f"gate.performance.input_tokens + output_tokens ({performance.input_tokens} + {performance.output_tokens}) "
                f"exceeds build.max_seq_len ({self.build.max_seq_len})"
            )
        ranks = self.build.tp_size * self.build.pp_size * self.serve.instances.tensorrt_llm
        if self.build.target is Target.engine and self.deploy.gpus and len(self.deploy.gpus) != ranks:
            raise ValueError(
                f"deploy.gpus lists {len(self.deploy.gpus)} GPU(s) but build.tp_size ({self.build.tp_size}) × build.pp_size "
                f"({self.build.pp_size}) × serve.instances.tensorrt_llm ({self.serve.instances.tensorrt_llm}) = {ranks}"
            )
        return self


def _check_lora_and_speculative(build: BuildSpec, serve: ServeSpec) -> None:
    """LoRA and speculative decoding: engine target only; serve.lora only with build.lora, and large enough for it."""
    target = build.target
    for section, what in (("lora", "LoRA"), ("speculative", "speculative decoding")):
        if getattr(build, section) is None or target is Target.engine:
            continue
        why = f"the cpu reference engine (refengine) does not implement {what}" if target is Target.cpu else (
            f"the {target.value} target does not build {what} in this version")
        raise ValueError(f"build.{section} is set, but build.target is {target.value}: {why}; use target engine or remove build.{section}")
    lora, serve_lora = build.lora, serve.lora
    if serve_lora is None:
        return
    if lora is None:
        raise ValueError("serve.lora is set, but build.lora is not: the LoRA cache needs an engine built with LoRA")
    largest = serve_lora.cache_max_adapter_size
    if largest is not None and largest < lora.max_rank:
        raise ValueError(
            f"serve.lora.cache_max_adapter_size ({largest}) is below build.lora.max_rank ({lora.max_rank}): adapters of the "
            "ranks the engine accepts would not fit the LoRA cache"
        )
    if largest is None and serve_lora.cache_optimal_adapter_size > lora.max_rank:
        raise ValueError(
            f"serve.lora.cache_optimal_adapter_size ({serve_lora.cache_optimal_adapter_size}) exceeds the LoRA cache's largest "
            f"adapter size, build.lora.max_rank ({lora.max_rank})"
        )

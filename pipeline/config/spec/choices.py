"""The closed choices of the spec: every enum a YAML field takes its value from (the build target is `pipeline.config.targets.Target`)."""

from __future__ import annotations

from enum import Enum


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
    kubernetes = "kubernetes"


class GPUModel(str, Enum):
    h100_80gb = "H100-80GB"
    h200 = "H200"
    l40s = "L40S"
    a100_80gb = "A100-80GB"
    b200 = "B200"


class LoraTargetModule(str, Enum):
    """TensorRT-LLM LoRA module ids (LoraManager.LORA_MODULE_IDS) of a dense decoder; build.lora.target_modules gives each one's Hugging Face PEFT name."""

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
    """build.speculative.mode: trtllm-build's --speculative_decoding_mode choices (TensorRT-LLM 1.2), and prompt_lookup (a
    draft_tokens_external engine fed n-grams of the request) and mtp (the PyTorch backend's multi-token prediction)."""

    lookahead_decoding = "lookahead_decoding"
    draft_tokens_external = "draft_tokens_external"
    # not a trtllm-build choice: an engine built with draft_tokens_external whose drafts are n-grams of the request's
    # own tokens (TensorRT-LLM's examples/prompt_lookup), with no draft model
    prompt_lookup = "prompt_lookup"
    medusa = "medusa"
    # engine: EAGLE-1/2; llmapi: EAGLE-3 (the PyTorch backend's Eagle3DecodingConfig)
    eagle = "eagle"
    explicit_draft_tokens = "explicit_draft_tokens"
    # not a trtllm-build choice: the PyTorch backend's multi-token prediction (MTPDecodingConfig), llmapi target
    mtp = "mtp"


class SchedulerPolicy(str, Enum):
    guaranteed_no_evict = "guaranteed_no_evict"
    max_utilization = "max_utilization"


class GateEndpoint(str, Enum):
    grpc = "grpc"
    http = "http"
    openai = "openai"


class GuidedDecodingBackend(str, Enum):
    xgrammar = "xgrammar"
    none = "none"

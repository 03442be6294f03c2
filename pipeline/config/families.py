"""The model families the pipeline takes: one row per family, and which build targets run it in which formats.

A row names the Hugging Face `model_type`s and classes of a family, the TensorRT-LLM 1.2 model class that
builds it with trtllm-build (`MODEL_MAP`; None: not there, so the engine target cannot take it), whether
TensorRT-LLM 1.2's PyTorch backend registers it (the llmapi target), and the weight formats a target refuses
for it, with the reason. The cpu target runs what the reference engine runs (`refengine.architectures`, its
own table); the GPU targets no longer inherit its limits. `validate` reads this table; the engine target's
checkpoint config writer (`pipeline.quantization.trtllm_checkpoint.pretrained`) reads `trtllm_class` and the family keys.

Sources: NVIDIA/TensorRT-LLM, 1.2 release line: tensorrt_llm/models/__init__.py (MODEL_MAP) and each class's
config.py `from_hugging_face` (the checkpoint keys), tensorrt_llm/_torch/models/__init__.py (the PyTorch backend's
registry), NVIDIA/TensorRT-LLM docs/source/legacy/reference/support-matrix.md (the TensorRT backend's precision matrix) and
examples/models/core/gemma/README.md (Gemma's build and serve rules); ModelOpt 0.47's export_hf_checkpoint per family
and format, run on CPU (transformers 5.14) and on an H200 (transformers 5.17) with the same results.
Torch-free: `validate` and `plan` read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.config.targets import Target, targets_on, traits_of
from refengine.architectures import HF_MODEL_TYPES as REFENGINE_MODEL_TYPES

BACKENDS = ("trtllm-build", "pytorch", "refengine")  # TargetTraits.model_backend values
ENGINE_VERSION = "TensorRT-LLM 1.2"

# Why a family's format is refused, shared by several rows.
_AWQ_FUSED_EXPERTS = (
    "ModelOpt 0.47 cannot export AWQ for transformers 5's fused MoE experts ('object of type QuantExperts has no "
    "len()', measured with 0.47.0 on CPU and on an H200): use fp8"
)
_MOE_WEIGHT_ONLY = (
    "weight-only formats on MoE experts are not built here: TensorRT-LLM's MoE without its plugin (MoeOOTB) raises "
    "for weight-only quantization, and the W8A16 checkpoint this tool writes leaves the stacked experts for "
    "trtllm-build to quantize, which no one has verified: use fp8 (or none)"
)
_MOE_SMOOTHQUANT = "NVIDIA's TensorRT-backend precision matrix lists no INT8 SmoothQuant for MoE models: use fp8"
_GEMMA_W4A8 = (
    "Gemma needs ModelOpt's awq_lite alpha_step 1 for W4A8 AWQ ('default search overflows in TRT-LLM kernels', "
    "modelopt_recipes/huggingface/gemma), which this tool does not apply yet: use int4_awq or fp8"
)
_REFENGINE_MOE = "the cpu reference engine runs MoE experts unquantized or FP8 (the converter stacks them so, refengine/model_runner/moe.py): use fp8 or none"
_STARCODER2_MATRIX = "NVIDIA's TensorRT-backend precision matrix lists only FP8, W8A16 and W4A16 for StarCoder2"


@dataclass(frozen=True)
class Family:
    name: str
    hf_model_types: tuple[str, ...]
    hf_architectures: tuple[str, ...]  # Hugging Face classes (config.json `architectures[0]`)
    trtllm_class: str | None  # TensorRT-LLM 1.2's model class for trtllm-build (MODEL_MAP value); None: not in MODEL_MAP
    llmapi: bool  # TensorRT-LLM 1.2's PyTorch backend registers these architectures
    moe: bool = False
    # "backend:algo" (or "*:algo" for every backend) -> why that quantize.algo is refused for this family
    refused_formats: Mapping[str, str] = field(default_factory=dict)
    # a limit on build.max_seq_len where the model runs without its sliding windows (trtllm-build's engine, and
    # refengine reading the checkpoint that engine is built from); the PyTorch backend keeps the windows
    max_seq_len_without_windows: int | None = None
    max_seq_len_rule: str = ""  # why
    # trtllm-build's engine keeps the HF config's sliding windows (through the runtime's per-layer window vector,
    # which the checkpoint config's keys give): Gemma 3 only; the PyTorch backend takes them for every family
    engine_windows: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "refused_formats", MappingProxyType(dict(self.refused_formats)))

    def runs_on(self, backend: str) -> bool:
        return {
            "trtllm-build": self.trtllm_class is not None,
            "pytorch": self.llmapi,
            "refengine": any(model_type in REFENGINE_MODEL_TYPES for model_type in self.hf_model_types),
        }[backend]

    def targets(self) -> tuple[str, ...]:
        """The build.target values that take this family."""
        return tuple(target for backend in BACKENDS if self.runs_on(backend) for target in targets_on(backend))

    def format_refusal(self, target: Target, algo: str) -> str | None:
        """Why `algo` cannot be built for this family on `target`, or None."""
        backend = traits_of(target).model_backend
        return self.refused_formats.get(f"{backend}:{algo}") or self.refused_formats.get(f"*:{algo}")

    def runtime_windows(self, target: Target) -> bool:
        """Whether `target`'s runtime keeps only each sliding layer's window in the KV cache (the capacity planner's
        question); refengine attends over whole sequences."""
        backend = traits_of(target).model_backend
        return backend == "pytorch" or (backend == "trtllm-build" and self.engine_windows)

    def max_seq_len_on(self, target: Target) -> int | None:
        return self.max_seq_len_without_windows if traits_of(target).model_backend in ("trtllm-build", "refengine") else None

    def target_refusal(self, target: Target, architecture: str) -> str | None:
        """Why `target` does not take this family (naming where it runs instead), or None."""
        backend = traits_of(target).model_backend
        if self.runs_on(backend):
            return None
        why = {
            "trtllm-build": f"{architecture} is not in {ENGINE_VERSION}'s MODEL_MAP, so trtllm-build cannot build it",
            "pytorch": f"{ENGINE_VERSION}'s PyTorch backend registers no {architecture}",
            "refengine": f"the cpu reference engine runs {', '.join(REFENGINE_MODEL_TYPES)} only",
        }[backend]
        instead = self.targets()
        where = (
            f"use build.target {' or '.join(instead)}" if instead else (f"no {ENGINE_VERSION} backend runs it (neither trtllm-build nor the PyTorch backend)")
        )
        return f"{self.name} does not run on build.target {target.value}: {why}; {where}"


def _moe_refusals(*, engine_smoothquant: bool = True) -> dict[str, str]:
    refused = {
        "*:int4_awq": _AWQ_FUSED_EXPERTS,
        "*:w4a8_awq": _AWQ_FUSED_EXPERTS,
        "trtllm-build:int8_wo": _MOE_WEIGHT_ONLY,
        "refengine:int8_wo": _REFENGINE_MOE,
        "refengine:int8_sq": _REFENGINE_MOE,
    }
    if engine_smoothquant:
        refused["trtllm-build:int8_sq"] = _MOE_SMOOTHQUANT
    return refused


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), ("LlamaForCausalLM",), "LLaMAForCausalLM", True, notes="Llama 2/3/3.1/3.2/3.3, Code Llama"),
    Family(
        "mistral",
        ("mistral",),
        ("MistralForCausalLM",),
        "LLaMAForCausalLM",
        True,
        notes="Mistral 7B, Mistral-NeMo (the LLaMA class; the engine ignores HF sliding_window)",
    ),
    Family(
        "mixtral",
        ("mixtral",),
        ("MixtralForCausalLM",),
        "LLaMAForCausalLM",
        True,
        moe=True,
        refused_formats=_moe_refusals(),
        notes="the LLaMA class with moe{top_k, RENORMALIZE}",
    ),
    Family("qwen2", ("qwen2",), ("Qwen2ForCausalLM",), "QWenForCausalLM", True, notes="Qwen2, Qwen2.5"),
    Family(
        "qwen2_moe",
        ("qwen2_moe",),
        ("Qwen2MoeForCausalLM",),
        "QWenForCausalLM",
        True,
        moe=True,
        refused_formats=_moe_refusals(),
        notes="routed + shared experts",
    ),
    Family(
        "qwen3",
        ("qwen3",),
        ("Qwen3ForCausalLM",),
        "QWenForCausalLM",
        True,
        notes="q/k RMSNorm, head_dim independent of hidden ÷ heads, no QKV bias (TensorRT backend since 1.0)",
    ),
    Family(
        "qwen3_moe",
        ("qwen3_moe",),
        ("Qwen3MoeForCausalLM",),
        "QWenForCausalLM",
        True,
        moe=True,
        refused_formats=_moe_refusals(),
        notes="Qwen3-30B-A3B, Qwen3-235B-A22B",
    ),
    Family("gemma", ("gemma",), ("GemmaForCausalLM",), "GemmaForCausalLM", False, refused_formats={"*:w4a8_awq": _GEMMA_W4A8}, notes="Gemma 1"),
    Family(
        "gemma2",
        ("gemma2",),
        ("Gemma2ForCausalLM",),
        "GemmaForCausalLM",
        False,
        refused_formats={"*:w4a8_awq": _GEMMA_W4A8},
        max_seq_len_without_windows=4096,
        max_seq_len_rule="the TensorRT-LLM Gemma 2 checkpoint and engine have no sliding-window attention; NVIDIA's Gemma "
        "README limits it "
        "to 4096 tokens, its local layers' window",
        notes="soft-capping, pre/post feed-forward norms, alternating 4096-token local layers",
    ),
    Family(
        "gemma3_text",
        ("gemma3_text",),
        ("Gemma3ForCausalLM",),
        "GemmaForCausalLM",
        True,
        refused_formats={"*:w4a8_awq": _GEMMA_W4A8},
        engine_windows=True,
        notes="Gemma 3 text (1B; the text part of larger ones): local layers windowed through the runtime's per-layer max_attention_window_size",
    ),
    Family("phi3", ("phi3",), ("Phi3ForCausalLM",), "Phi3ForCausalLM", True, notes="Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini (long_rope for the 128k variants)"),
    Family(
        "granite",
        ("granite",),
        ("GraniteForCausalLM",),
        "LLaMAForCausalLM",
        False,
        notes="Granite 3 dense: the LLaMA class with embedding/attention/residual/logits multipliers",
    ),
    Family(
        "starcoder2",
        ("starcoder2",),
        ("Starcoder2ForCausalLM",),
        "GPTForCausalLM",
        True,
        refused_formats={"trtllm-build:int8_sq": _STARCODER2_MATRIX, "trtllm-build:int4_awq": _STARCODER2_MATRIX, "trtllm-build:w4a8_awq": _STARCODER2_MATRIX},
        notes="the GPT class (gpt_variant starcoder2): LayerNorm with bias, GELU MLP",
    ),
    Family(
        "nemotron",
        ("nemotron",),
        ("NemotronForCausalLM",),
        "GPTForCausalLM",
        True,
        notes="Nemotron-3/4, Minitron: the GPT class (gpt_variant nemotron), squared-ReLU MLP",
    ),
    Family(
        "deepseek_v3",
        ("deepseek_v3",),
        ("DeepseekV3ForCausalLM",),
        None,
        True,
        moe=True,
        refused_formats=_moe_refusals(engine_smoothquant=False),
        notes="MLA (one latent KV head), 256 routed + 1 shared expert; PyTorch backend only",
    ),
    Family(
        "gpt_oss",
        ("gpt_oss",),
        ("GptOssForCausalLM",),
        None,
        True,
        moe=True,
        refused_formats={
            "*:int4_awq": "ModelOpt 0.47 refuses AWQ for GPT-OSS ('gptossforcausallm not supported'): use fp8",
            "*:w4a8_awq": "ModelOpt 0.47 refuses AWQ for GPT-OSS ('gptossforcausallm not supported'): use fp8",
        },
        notes="alternating 128-token sliding layers, attention sinks; PyTorch backend only",
    ),
    Family(
        "llama4",
        ("llama4", "llama4_text"),
        ("Llama4ForConditionalGeneration", "Llama4ForCausalLM"),
        None,
        True,
        moe=True,
        refused_formats=_moe_refusals(engine_smoothquant=False),
        notes="Llama 4 Scout/Maverick (MoE with a shared expert, chunked attention); PyTorch backend only",
    ),
    Family("olmo2", ("olmo2", "olmo"), ("Olmo2ForCausalLM", "OlmoForCausalLM"), None, False, notes="no TensorRT-LLM 1.2 backend builds it"),
)

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.hf_model_types}


def family_of(model_type: str) -> Family | None:
    """The row of a Hugging Face `model_type`, or None."""
    return _BY_MODEL_TYPE.get(model_type)


def known_model_types() -> tuple[str, ...]:
    return tuple(_BY_MODEL_TYPE)


def model_types_on(target: Target) -> tuple[str, ...]:
    """The Hugging Face model types `target` builds."""
    backend = traits_of(target).model_backend
    return tuple(model_type for model_type, family in _BY_MODEL_TYPE.items() if family.runs_on(backend))


def support_markdown() -> str:
    """The family × target table of README.md and docs/targets.md: which targets take each family, and in which quantize.algo formats."""
    from pipeline.quant_formats import WEIGHT_FORMATS

    header = "| family | Hugging Face model_type | engine (trtllm-build) | llmapi (PyTorch backend) | cpu (refengine) |"
    lines = [header, "| --- | --- | --- | --- | --- |"]
    for family in FAMILIES:
        cells = []
        for target in (Target.engine, Target.llmapi, Target.cpu):
            if not family.runs_on(traits_of(target).model_backend):
                cells.append("—")
                continue
            taken = [f.name for f in WEIGHT_FORMATS.values() if f.runs_on(target.value) and not family.format_refusal(target, f.name)]
            cells.append("✓ " + " ".join(taken))
        types = ", ".join(f"`{t}`" for t in family.hf_model_types)
        lines.append(f"| {family.name} | {types} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"

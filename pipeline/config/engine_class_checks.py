"""Where TensorRT-LLM 1.2's model class for a family would build a different model than the checkpoint holds: refused
on the engine target at `validate`, naming the family, the field and the targets that run it.

Sources (NVIDIA/TensorRT-LLM v1.2.0): tensorrt_llm/models/phi3/model.py (Phi3Model creates the vocab embedding, the
final norm and lm_head on every rank, with no pipeline-stage test, so `trtllm-build` finds them "Required but not
provided" on the ranks past the first stage the checkpoint writes them for); tensorrt_llm/models/gemma/model.py and
layers/attention.py (Gemma 3's local layers take `rope_local_base_freq` but the same `rotary_scaling` as the global
ones, where transformers' Gemma3 leaves the local layers unscaled). Which decoder Linears each class gives a bias:
models/llama/config.py (attn_bias = attention_bias, mlp_bias), models/qwen/config.py (q/k/v biases for Qwen 1/2, none
for Qwen3), models/gemma/config.py (attn_bias and mlp_bias default false; from_hugging_face reads neither),
models/phi3/model.py (no biases), models/gpt/config.py (`bias`: StarCoder2's use_bias; none for Nemotron). A
checkpoint bias the class does not declare would be converted and then ignored by `trtllm-build` ("Provided but not
required tensors" is only logged): the engine would run without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config.families import Family
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.config.targets import traits_of
from pipeline.config.weight_checks import WeightHeaderError, weight_shapes

Issue = tuple[tuple[str | int, ...], str]


def engine_class_issues(spec: Spec, info: ModelInfo, family: Family) -> list[Issue]:
    """The engine target's refusals for what its TensorRT-LLM class computes differently (none on other targets)."""
    if traits_of(spec.build.target).model_backend != "trtllm-build":
        return []
    issues: list[Issue] = []
    if family.name == "phi3" and spec.build.pp_size > 1:
        issues.append(
            (
                ("build", "pp_size"),
                f"build.pp_size {spec.build.pp_size} is not built for phi3 on build.target engine: TensorRT-LLM 1.2's "
                "Phi3ForCausalLM has no pipeline stages (every rank declares the embedding, final norm and lm_head), so "
                "trtllm-build fails past the first stage; use build.pp_size 1 (build.tp_size to spread over GPUs), or "
                "build.target llmapi or cpu",
            )
        )
    scaling = _global_rope_scaling(info.text_config)
    if family.name == "gemma3_text" and scaling is not None:
        issues.append(
            (
                ("build", "target"),
                f"gemma3_text with rope_scaling {scaling} (in {info.path / 'config.json'}) does not run on build.target "
                "engine: TensorRT-LLM 1.2's GemmaForCausalLM applies the scaling to the local (sliding-window) layers' "
                "RoPE too, which the model leaves unscaled, so the engine would compute another model; use "
                "build.target llmapi or cpu",
            )
        )
    undeclared = _undeclared_biases(info, family)
    if undeclared:
        more = f" (and {len(undeclared) - 1} more bias tensors)" if len(undeclared) > 1 else ""
        issues.append(
            (
                ("build", "target"),
                f"{undeclared[0]}{more} in {info.path}: TensorRT-LLM 1.2's {family.trtllm_class} declares no such bias "
                f"for {family.name} with this config.json, so an engine would run without it (trtllm-build only logs "
                "tensors it does not need); use build.target llmapi or cpu",
            )
        )
    return issues


def _declared_bias_modules(family: Family, text: Mapping[str, Any]) -> set[str]:
    """The Hugging Face decoder Linears (names inside a layer) whose bias the family's TensorRT-LLM class declares."""
    attention = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
    mlp = {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    if family.trtllm_class == "LLaMAForCausalLM":
        return (attention if text.get("attention_bias") else set()) | (mlp if text.get("mlp_bias") else set())
    if family.trtllm_class == "QWenForCausalLM":
        return set() if family.name.startswith("qwen3") else {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}
    if family.trtllm_class == "GPTForCausalLM" and text.get("use_bias", family.name == "starcoder2"):
        return attention | {"mlp.c_fc", "mlp.c_proj"}
    return set()


def _undeclared_biases(info: ModelInfo, family: Family) -> list[str]:
    """The checkpoint's decoder-Linear biases its TensorRT-LLM class would not read (header names only)."""
    try:
        names = weight_shapes(info)
    except (WeightHeaderError, OSError):  # reported by the weight checks
        return []
    declared = _declared_bias_modules(family, info.text_config)
    found = []
    for name in sorted(names):
        module, _, kind = name.rpartition(".")
        _, _, rest = module.partition(".layers.")
        linear = rest.partition(".")[2]
        if kind == "bias" and linear and "norm" not in linear and linear not in declared:
            found.append(name)
    return found


def _global_rope_scaling(text: Mapping[str, Any]) -> str | None:
    """'<type> x<factor>' of the global layers' RoPE scaling (transformers 5's rope_parameters per layer type, or
    4.x's rope_scaling); None when unscaled."""
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return None
    return f"{rope_type} x{params.get('factor')}" if params.get("factor") is not None else str(rope_type)

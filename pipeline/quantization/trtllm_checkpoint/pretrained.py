"""The TensorRT-LLM checkpoint `config.json` (pretrained_config) of a Hugging Face model, per family.

The common keys are what ModelOpt 0.47's TensorRT-LLM export writes for the Llama family and Qwen2 (the dry run
of those has always matched it); each TensorRT-LLM model class then reads family keys of its own, written here
as its `from_hugging_face` writes them (NVIDIA/TensorRT-LLM tensorrt_llm/models/<family>/config.py, 1.2 line): `qwen_type`, `attn_bias` and
the `moe` object for QWenForCausalLM; `moe` and Granite's multipliers for LLaMAForCausalLM; `inter_layernorms`,
soft-capping, `query_pre_attn_scalar` and Gemma 3's local-layer keys for GemmaForCausalLM; partial rotary and
long-RoPE factors for Phi3ForCausalLM; `gpt_variant` for GPTForCausalLM. The family row
(`pipeline.config.families`) picks the class. Plain dicts in and out: no transformers, no tensorrt_llm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.config.families import Family, family_of
from pipeline.errors import StageError

LONG_ROPE_MIN_POSITIONS = 128000  # Phi-3's config switches to long_rope from here (tensorrt_llm/models/phi3/config.py)
_MOE_NORMALIZATION = {"none": 0, "renormalize": 1, "sparse_mixer": 2}


def checkpoint_mapping(tp_size: int, pp_size: int) -> dict[str, int]:
    """The checkpoint's `mapping` as ModelOpt 0.47 wrote it (TensorRT-LLM then takes moe_tp_size = tp_size)."""
    return {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size}


def pretrained_config(hf: Mapping[str, Any], *, dtype: str, mapping: dict[str, Any], quantization: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint config.json body for the Hugging Face config `hf` (its text part for multimodal configs)."""
    model_type = str(hf.get("model_type", ""))
    family = family_of(model_type)
    if family is None or family.trtllm_class is None:
        raise StageError(f"model_type {model_type!r} has no TensorRT-LLM 1.2 checkpoint layout (trtllm-build cannot build it)")
    text = hf.get("text_config") or hf
    config = _common(hf, text, family, dtype=dtype, mapping=mapping, quantization=quantization)
    config.update(_FAMILY_KEYS[family.trtllm_class](text, family, config))
    return config


def _common(
    hf: Mapping[str, Any], text: Mapping[str, Any], family: Family, *, dtype: str, mapping: dict[str, Any], quantization: dict[str, Any]
) -> dict[str, Any]:
    if family.trtllm_class is None:  # pretrained_config refuses such families before this
        raise StageError(f"{family.name}: TensorRT-LLM 1.2 has no checkpoint class for this family")
    heads, hidden = int(text["num_attention_heads"]), int(text["hidden_size"])
    architectures = hf.get("architectures") or [family.hf_architectures[0]]
    config: dict[str, Any] = {
        "architecture": architectures[0],
        "dtype": dtype,
        "logits_dtype": dtype,  # as ModelOpt 0.47 exports it
        "num_hidden_layers": int(text["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(text.get("num_key_value_heads") or heads),
        "hidden_size": hidden,
        "norm_epsilon": float(text.get("rms_norm_eps", text.get("norm_epsilon", text.get("layer_norm_eps", 1e-5)))),
        "vocab_size": int(text["vocab_size"]),
        "max_position_embeddings": int(text.get("max_position_embeddings") or 2048),
        "hidden_act": str(text.get("hidden_act") or text.get("hidden_activation") or "silu"),
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "head_size": int(text.get("head_dim") or hidden // heads),
        "intermediate_size": int(text.get("intermediate_size") or 0),
        "position_embedding_type": "rope_gpt_neox",
        # ModelOpt 0.47 writes the lm_head out (and False here) whenever the model has an lm_head Linear, tied or not
        "share_embedding_table": False,
        "residual_mlp": False,
        "bias": bool(text.get("attention_bias", False)),
        "rotary_pct": 1.0,
        "rank": 0,
        "decoder": _MODELOPT_DECODER[family.trtllm_class],
        "rmsnorm": True,
        "lm_head_bias": False,
        "mapping": mapping,
        "quantization": quantization,
    }
    config.update(rope_fields(text))
    return config


def _tied(text: Mapping[str, Any]) -> bool:
    return bool(text.get("tie_word_embeddings", False))


def rope_fields(text: Mapping[str, Any]) -> dict[str, Any]:
    """`rotary_base` / `rotary_scaling` from a Hugging Face config (transformers 5's rope_parameters or 4.x's keys)."""
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    if isinstance(params.get("full_attention"), Mapping):  # per layer type (Gemma 3): the global layers' RoPE
        params = dict(params["full_attention"])
    params.pop("partial_rotary_factor", None)  # TensorRT-LLM's rotary_pct (transformers >= 5.2x keeps it here)
    theta = params.pop("rope_theta", None) or text.get("rope_theta") or 10000.0
    fields: dict[str, Any] = {"rotary_base": float(theta)}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type != "default":
        fields["rotary_scaling"] = {**params, "type": rope_type, "rope_type": rope_type}
    return fields


def _rope_value(text: Mapping[str, Any], key: str, default: Any) -> Any:
    """A RoPE key at the config's top level (transformers 4.x, early 5.x) or inside rope_parameters (later 5.x)."""
    value = text.get(key)
    if value is None:
        value = (text.get("rope_parameters") or text.get("rope_scaling") or {}).get(key)
    return default if value is None else value


def _moe(text: Mapping[str, Any], normalization: str) -> dict[str, Any]:
    experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
    return {
        "num_experts": experts,
        "top_k": int(text.get("num_experts_per_tok") or 0) if experts else 0,
        "normalization_mode": _MOE_NORMALIZATION[normalization],
    }


def _llama_keys(text: Mapping[str, Any], family: Family, common: dict[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {"mlp_bias": bool(text.get("mlp_bias", False)), "attn_bias": common["bias"]}
    if family.moe:  # Mixtral: softmax over the top-k logits, then renormalised (MoeConfig RENORMALIZE)
        keys.update(moe=_moe(text, "renormalize"), hidden_act="swiglu")
    if family.name == "granite":
        keys.update(
            embedding_multiplier=float(text.get("embedding_multiplier", 1.0)),
            attention_multiplier=float(text.get("attention_multiplier", 1.0)) * math.sqrt(common["head_size"]),
            residual_multiplier=float(text.get("residual_multiplier", 1.0)),
            output_multiplier_scale=1.0 / float(text.get("logits_scaling", 1.0)),
        )
    return keys


def _qwen_keys(text: Mapping[str, Any], family: Family, common: dict[str, Any]) -> dict[str, Any]:
    qwen3 = family.name.startswith("qwen3")
    keys: dict[str, Any] = {
        "qwen_type": family.name,
        "attn_bias": not qwen3,  # QWenConfig: no attention bias for qwen3 / qwen3_moe, a q/k/v bias before
        "bias": False,  # ModelOpt's `bias` is o_proj's bias, which no Qwen has (QWen's dense_bias is False)
        "mlp_bias": False,
        "qk_layernorm": qwen3,
        "seq_length": int(text.get("seq_length", 8192)),
        "use_logn_attn": False,
        "moe_intermediate_size": int(text.get("moe_intermediate_size") or 0),
        "moe_shared_expert_intermediate_size": int(text.get("shared_expert_intermediate_size") or 0),
        # QWenConfig.from_hugging_face writes NONE for every Qwen MoE, while transformers renormalises the top-k weights
        # when norm_topk_prob is true (every released Qwen3-MoE; TensorRT-LLM's PyTorch backend always renormalises
        # Qwen3-MoE): RENORMALIZE then, so that an engine of the checkpoint (and refengine) routes as the model does.
        "moe": _moe(text, "renormalize" if text.get("norm_topk_prob") else "none"),
        "disable_weight_only_quant_plugin": False,
        "tie_word_embeddings": _tied(text),
    }
    if family.moe:
        keys["hidden_act"] = "swiglu"
    return keys


def _gemma_keys(text: Mapping[str, Any], family: Family, common: dict[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {
        "share_embedding_table": True,  # GemmaConfig always ties the embeddings
        "use_parallel_embedding": int(common["mapping"].get("tp_size", 1)) > 1,
        "attn_bias": False,
        "mlp_bias": False,
        "inter_layernorms": family.name != "gemma",
    }
    if family.name != "gemma":
        # GemmaConfig copies Hugging Face's `hidden_act` key as it is (Gemma 1's gelu_pytorch_tanh); Gemma 2/3 name
        # theirs `hidden_activation`, so it writes its default `gelu`, the same tanh GELU in TensorRT-LLM's ACT2FN, and
        # the one `fuse_gate_mlp` fuses (NVIDIA/TensorRT-LLM v1.2.0 tensorrt_llm/models/gemma/config.py,
        # models/modeling_utils.py)
        keys["hidden_act"] = "gelu"
    if family.name == "gemma2":
        keys.update(
            query_pre_attn_scalar=int(text["query_pre_attn_scalar"]),
            final_logit_softcapping=text.get("final_logit_softcapping"),
            attn_logit_softcapping=text.get("attn_logit_softcapping"),
        )
    if family.name == "gemma3_text":
        keys.update(
            query_pre_attn_scalar=int(text["query_pre_attn_scalar"]),
            final_logit_softcapping=text.get("final_logit_softcapping"),
            qk_layernorm=True,
            sliding_window=int(text["sliding_window"]),
            _sliding_window_pattern=int(text.get("sliding_window_pattern") or _pattern_of(text)),
            rope_local_base_freq=float(text.get("rope_local_base_freq") or _local_rope_theta(text) or 10000.0),
        )
    return keys


def _pattern_of(text: Mapping[str, Any]) -> int:
    """Gemma 3's period of local layers from transformers 5's layer_types (one global layer per period)."""
    types = list(text.get("layer_types") or [])
    return types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1


def _local_rope_theta(text: Mapping[str, Any]) -> float | None:
    local = (text.get("rope_parameters") or {}).get("sliding_attention") or {}
    return local.get("rope_theta")


def _phi3_keys(text: Mapping[str, Any], family: Family, common: dict[str, Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {
        "rotary_pct": float(_rope_value(text, "partial_rotary_factor", 1.0)),
        "tie_word_embeddings": _tied(text),
        # Phi3Config.from_hugging_face: silu becomes swiglu, the plain MLP's activation over fc's [up; gate] rows
        # (NVIDIA/TensorRT-LLM v1.2.0 tensorrt_llm/models/phi3/config.py, layers/mlp.py MLP)
        "hidden_act": "swiglu",
    }
    scaling = common.get("rotary_scaling") or {}
    if common["max_position_embeddings"] >= LONG_ROPE_MIN_POSITIONS and scaling:
        keys.update(
            position_embedding_type="long_rope",
            original_max_position_embeddings=int(_rope_value(text, "original_max_position_embeddings", 4096)),
            longrope_scaling_short_factors=scaling.get("short_factor"),
            longrope_scaling_long_factors=scaling.get("long_factor"),
        )
    return keys


def _gpt_keys(text: Mapping[str, Any], family: Family, common: dict[str, Any]) -> dict[str, Any]:
    bias = bool(text.get("use_bias", family.name == "starcoder2"))
    keys: dict[str, Any] = {
        "gpt_variant": family.name,
        "bias": bias,
        "rmsnorm": False,  # LayerNorm (with a bias for StarCoder2; Nemotron's is LayerNorm1P)
        "rotary_pct": float(_rope_value(text, "partial_rotary_factor", 1.0)),
        "norm_epsilon": float(text.get("norm_epsilon", text.get("norm_eps", common["norm_epsilon"]))),
        "hidden_act": "squared-relu" if family.name == "nemotron" else "gelu",
        "q_scaling": 1.0,
        "inner_layernorm": False,
        "apply_query_key_layer_scaling": False,
    }
    return keys


_FAMILY_KEYS: dict[str, Callable[[Mapping[str, Any], Family, dict[str, Any]], dict[str, Any]]] = {
    "LLaMAForCausalLM": _llama_keys,
    "QWenForCausalLM": _qwen_keys,
    "GemmaForCausalLM": _gemma_keys,
    "Phi3ForCausalLM": _phi3_keys,
    "GPTForCausalLM": _gpt_keys,
}
# ModelOpt's `decoder_type` for each TensorRT-LLM class (MODEL_NAME_TO_TYPE in nvidia-modelopt 0.47.0, modelopt/torch/export/model_utils.py).
_MODELOPT_DECODER = {"LLaMAForCausalLM": "llama", "QWenForCausalLM": "qwen", "GemmaForCausalLM": "gemma", "Phi3ForCausalLM": "phi3", "GPTForCausalLM": "gpt"}

"""What a model weighs and what its KV cache costs, from config.json alone, per family (the capacity planner's arithmetic).

Parameters: attention (MLA for DeepSeek), a gated or plain MLP, MoE experts (every expert resident; the top-k a
token reads counted apart), norms; embedding and lm_head stay 16-bit. KV cache (TensorRT-LLM's KV cache manager, NVIDIA/TensorRT-LLM
cpp/include/tensorrt_llm/batch_manager/kvCacheManager.h and _torch/pyexecutor/resource_manager.py, 1.2 line):
per layer and token kv_heads/tp (replicated below one) × 2 (K, V) × head_dim × bytes, head_dim being the config's
own; MLA caches one latent of kv_lora_rank + qk_rope_head_dim once (kvFactor 1, not split by TP); a layer with an
attention window holds at most that window per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.model_info import ModelInfo
from pipeline.errors import SpecError
from pipeline.quant_formats import KV_CACHE_FORMATS, WEIGHT_FORMATS

_SIXTEEN_BIT = 2.0
SIXTEEN_BIT_KV_DTYPES = ("float16", "bfloat16")  # an unquantized KV cache named by its dtype


@dataclass(frozen=True)
class ParamCount:
    decoder: int  # every decoder-layer parameter (linear layers, routers, experts and their norms)
    embedding: int  # vocab_embedding
    lm_head: int  # 0 when tied to the embedding
    final_norm: int
    active_decoder: int | None = None  # a MoE model's decoder parameters one token reads (top-k experts); None: all

    @property
    def total(self) -> int:
        return self.decoder + self.embedding + self.lm_head + self.final_norm

    @property
    def read_per_token(self) -> int:
        """Decoder parameters a batch-1 decoding step reads."""
        return self.decoder if self.active_decoder is None else self.active_decoder


def count_params(model: ModelInfo, *, tied_embeddings: bool | None = None) -> ParamCount:
    """Parameters from config.json: attention (MLA for DeepSeek), a gated or plain MLP, MoE experts (every expert
    resident; `active_decoder` counts the top-k a token reads), norms. `tied_embeddings` None: the model's own."""
    h, layers = model.hidden_size, model.num_layers
    attention = _attention_params(model)
    gated = 3 if _gated_mlp(model) else 2
    norms = 2 * h
    dense = attention + gated * h * model.intermediate_size + norms
    moe = model.moe
    if moe is None:
        decoder, active = layers * dense, None
    else:
        shared = gated * h * moe.shared_expert_intermediate_size
        routed = moe.num_experts * gated * h * moe.expert_intermediate_size
        base = attention + h * moe.num_experts + shared + norms  # the router: hidden -> one logit per expert
        moe_layers = layers - moe.dense_layers
        decoder = moe.dense_layers * dense + moe_layers * (base + routed)
        active = moe.dense_layers * dense + moe_layers * (base + routed * moe.experts_per_token // moe.num_experts)
    embedding = model.vocab_size * h
    tied = model.tie_word_embeddings if tied_embeddings is None else tied_embeddings
    return ParamCount(decoder, embedding, 0 if tied else embedding, h, active)


def _attention_params(model: ModelInfo) -> int:
    h, heads, kv_heads, hd = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
    mla = model.mla
    if mla is None:
        return h * heads * hd + 2 * h * kv_heads * hd + heads * hd * h
    text = model.text_config
    nope, rope = int(text.get("qk_nope_head_dim") or 0), mla.qk_rope_head_dim
    v_dim, q_rank = int(text.get("v_head_dim") or hd), text.get("q_lora_rank")
    query = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank + q_rank * heads * (nope + rope)
    latent = h * mla.cached_width + mla.kv_lora_rank + mla.kv_lora_rank * heads * (nope + v_dim)
    return query + latent + heads * v_dim * h


def _gated_mlp(model: ModelInfo) -> bool:
    """GPT-class families (StarCoder2, Nemotron) have a plain two-matrix MLP; the others gate it."""
    return model.model_type not in ("starcoder2", "nemotron")


def weight_bytes_per_param(quant_algo: str, group_size: int = 128) -> float:
    if quant_algo not in WEIGHT_FORMATS:
        raise SpecError(f"quantize.algo {quant_algo!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[quant_algo].bytes_per_param(group_size)


def kv_element_bytes(kv_cache_dtype: str) -> float:
    if kv_cache_dtype in SIXTEEN_BIT_KV_DTYPES:
        return _SIXTEEN_BIT
    if kv_cache_dtype in KV_CACHE_FORMATS:
        return KV_CACHE_FORMATS[kv_cache_dtype].bytes_per_element
    known = ", ".join([*KV_CACHE_FORMATS, *SIXTEEN_BIT_KV_DTYPES])
    raise SpecError(f"KV-cache dtype {kv_cache_dtype!r} is not one of {known}")


def kv_bytes_per_layer_token(model: ModelInfo, kv_cache_dtype: str, tp: int = 1) -> int:
    """One layer's KV bytes for one token on one GPU (as TensorRT-LLM's KV cache manager counts it): kv_heads/tp (replicated below one) × 2 (K, V)
    × head_dim × bytes; MLA caches one latent of kv_lora_rank + qk_rope_head_dim, once (kvFactor 1, not split by TP)."""
    element = kv_element_bytes(kv_cache_dtype)
    if model.mla is not None:
        return int(model.mla.cached_width * element)
    kv_heads = max(1, model.num_kv_heads // tp)
    return int(2 * kv_heads * model.head_dim * element)


def kv_bytes_per_token(model: ModelInfo, kv_cache_dtype: str, tp: int = 1, windows: tuple[int | None, ...] = ()) -> int:
    """KV-cache bytes of one token on one GPU over the layers that keep every token (all layers without `windows`);
    windowed layers hold at most their window per sequence (kv_bytes_per_sequence)."""
    full_layers = model.num_layers - sum(w is not None for w in windows)
    return full_layers * kv_bytes_per_layer_token(model, kv_cache_dtype, tp)


def kv_bytes_per_sequence(model: ModelInfo, kv_cache_dtype: str, tp: int, length: int, tokens_per_block: int, windows: tuple[int | None, ...] = ()) -> int:
    """Block-rounded KV bytes one `length`-token sequence holds on one GPU: every token in full layers, the last
    min(length, window) tokens (plus the block being filled) in each windowed layer."""
    per_layer = kv_bytes_per_layer_token(model, kv_cache_dtype, tp)

    def blocks(tokens: int) -> int:
        return -(-tokens // tokens_per_block)

    windowed = sum(blocks(min(length, w + tokens_per_block)) for w in windows if w is not None)
    return (blocks(length) * (model.num_layers - sum(w is not None for w in windows)) + windowed) * tokens_per_block * per_layer

"""An oracle independent of the project's converter: the parameters TensorRT-LLM 1.2's model classes declare for a
checkpoint config.json, restated as data and small functions from reading NVIDIA's class definitions.

`declared_parameters(config, rank)` gives name -> (shape, dtype) of every Parameter the model class builds for that
rank and that `PretrainedModel.load` requires (buffers it fills itself, such as the RoPE tables, are left out).
`as_loaded(written, config)` applies the renames `preprocess_weights` makes before that check (the K/V cache scales
merged into one, the reciprocal added), and `compare` says what is missing, extra or of another shape/dtype.
NVIDIA's loader raises only for missing tensors and wrong shapes; here an extra tensor is an error too.

Read (public source, NVIDIA/TensorRT-LLM, the 1.2 release line; stored copies read file by file, the commit where
the copy carried one):
  models/modeling_utils.py (PretrainedConfig defaults, PretrainedModel.__post_init__/load, preprocess_weights,
    optimize_model/parallelize_embedding: the 1.2-era copy with Gemma3ConfigGroup);
  quantization/quantize.py (quantize, quantize_layers' default exclude list, fp8_quantize, kv_cache_quantize);
  quantization/layers.py (FP8Linear / FP8RowLinear: FP8 weight, weights_ and activation_scaling_factor (1,) f32);
  layers/linear.py, layers/embedding.py (ColumnLinear [out/tp, in], RowLinear [out, in/tp], Embedding
    ceil(vocab/tp) rows when sharded on dim 0); layers/normalization.py (RmsNorm weight; LayerNorm weight + bias);
  layers/attention.py (qkv [(h/tp + 2*ceil(kv/tp)) * d, H], dense [H, h/tp * d], qk_layernorm RmsNorm(d));
  layers/mlp.py (MLP: fc [I/tp, H], twice that for swiglu; GatedMLP adds `gate`; commit 04a2cacb);
  layers/moe.py (MixtureOfExperts: router RowLinear [E, H] float32 untouched by TP; MOEWeightWrapper fc
    [E, 2*I/tp, H] for gated activations, proj [E, H, I/tp], FP8 scales (E, 1) and (1,); SharedMoE adds
    shared_expert (MLP) and shared_expert_gate RowLinear [1, H]);
  models/llama/model.py + config.py (LLaMA: mixtral/granitemoe hidden_act forced to swiglu);
  models/qwen/model.py + config.py (QWen: dense_bias False, qk_layernorm for qwen3/qwen3_moe, MoE sizes);
  models/gemma/model.py + config.py (Gemma: use_parallel_embedding forced to tp_size > 1, inter_layernorms and
    qk_layernorm for Gemma 3, hidden_act copied from the HF config's `hidden_act`, else PretrainedConfig's 'gelu');
  models/phi3/model.py (commit 1479eaf5) + config.py (commit 1e6a4f97: silu -> swiglu; plain MLP; no pipeline
    stages for embedding, ln_f, lm_head);
  models/gpt/model.py + config.py (GPT: LayerNorm with bias everywhere, MLP or GatedMLP by activation,
    starcoder2 -> gelu, nemotron -> squared-relu, bias from use_bias / False).
Torch-free: shapes are tuples, dtypes the torch names without the `torch.` prefix.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

Shape = tuple[int, ...]
Declared = dict[str, tuple[Shape, str]]
FP8 = "float8_e4m3fn"
F32 = "float32"

# quantization/quantize.py quantize_layers: the list used when the checkpoint's exclude_modules is None
DEFAULT_EXCLUDES = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding", "*shared_expert_gate")
# models/__init__.py MODEL_MAP entries of the families the engine target builds
MODEL_MAP = {
    "LlamaForCausalLM": "LLaMAForCausalLM",
    "MistralForCausalLM": "LLaMAForCausalLM",
    "MixtralForCausalLM": "LLaMAForCausalLM",
    "GraniteForCausalLM": "LLaMAForCausalLM",
    "Qwen2ForCausalLM": "QWenForCausalLM",
    "Qwen2MoeForCausalLM": "QWenForCausalLM",
    "Qwen3ForCausalLM": "QWenForCausalLM",
    "Qwen3MoeForCausalLM": "QWenForCausalLM",
    "GemmaForCausalLM": "GemmaForCausalLM",
    "Gemma2ForCausalLM": "GemmaForCausalLM",
    "Gemma3ForCausalLM": "GemmaForCausalLM",
    "Phi3ForCausalLM": "Phi3ForCausalLM",
    "Starcoder2ForCausalLM": "GPTForCausalLM",
    "NemotronForCausalLM": "GPTForCausalLM",
}
GATED_ACTIVATIONS = ("swiglu", "gegelu")  # functional.is_gated_activation


def expected_hidden_act(hf: Mapping[str, Any]) -> str:
    """The `hidden_act` NVIDIA's `<Family>Config.from_hugging_face` writes for the Hugging Face config `hf`."""
    model_type = hf.get("model_type")
    if model_type in ("llama", "mistral", "granite"):
        return str(hf["hidden_act"])
    if model_type in ("mixtral", "granitemoe"):  # llama/config.py: the MoE kernels need the gate made explicit
        return "swiglu"
    if model_type in ("qwen2", "qwen3"):
        return str(hf["hidden_act"])
    if model_type in ("qwen2_moe", "qwen3_moe"):
        return "swiglu"
    if model_type in ("gemma", "gemma2", "gemma3_text"):  # VERBATIM copies `hidden_act`; Gemma 2/3 configs name it
        return str(hf.get("hidden_act") or "gelu")  # `hidden_activation`, so PretrainedConfig's default stays
    if model_type == "phi3":
        return "swiglu" if hf["hidden_act"] == "silu" else str(hf["hidden_act"])
    if model_type == "starcoder2":
        return "gelu"
    if model_type == "nemotron":
        return "squared-relu"
    raise ValueError(f"model_type {model_type!r}: no TensorRT-LLM 1.2 config restated here")


class _Rank:
    """What one rank's model declares, built layer by layer as the NVIDIA classes do."""

    def __init__(self, config: Mapping[str, Any], rank: int) -> None:
        self.c = config
        mapping = config["mapping"]
        self.tp, self.pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
        if not 0 <= rank < self.tp * self.pp:
            raise ValueError(f"rank {rank} outside mapping {dict(mapping)}")
        self.tp_rank, self.pp_rank = rank % self.tp, rank // self.tp
        self.moe_tp = int(mapping.get("moe_tp_size", self.tp))
        self.moe_ep = int(mapping.get("moe_ep_size", 1))
        self.dtype = str(config["dtype"])
        quant = config.get("quantization") or {}
        algo, kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
        if algo not in (None, "FP8") or kv not in (None, "FP8", "INT8"):
            raise NotImplementedError(f"quantization {algo}/{kv}: only unquantized and FP8 (+ FP8/INT8 KV) are restated")
        self.fp8, self.kv_quant = algo == "FP8", kv is not None
        excludes = quant.get("exclude_modules")
        self.excludes = tuple(excludes) if excludes is not None else DEFAULT_EXCLUDES
        self.out: Declared = {}

    # -- layers ------------------------------------------------------------------------------------------------
    def _quantized(self, module: str) -> bool:
        return self.fp8 and not any(fnmatch.fnmatchcase(module, pattern) for pattern in self.excludes)

    def _linear(self, name: str, out_rows: int, in_cols: int, bias: bool, dtype: str | None = None) -> None:
        dtype = dtype or self.dtype
        if self._quantized(name):  # FP8Linear / FP8RowLinear; the bias keeps the model dtype
            self.out[f"{name}.weight"] = ((out_rows, in_cols), FP8)
            self.out[f"{name}.weights_scaling_factor"] = ((1,), F32)
            self.out[f"{name}.activation_scaling_factor"] = ((1,), F32)
        else:
            self.out[f"{name}.weight"] = ((out_rows, in_cols), dtype)
        if bias:
            self.out[f"{name}.bias"] = ((out_rows,), dtype)

    def column(self, name: str, in_features: int, out_features: int, bias: bool, tp: int | None = None) -> None:
        tp = self.tp if tp is None else tp
        self._linear(name, out_features // tp, in_features, bias)

    def row(self, name: str, in_features: int, out_features: int, bias: bool, tp: int | None = None, dtype: str | None = None) -> None:
        tp = self.tp if tp is None else tp
        self._linear(name, out_features, in_features // tp, bias, dtype)

    def rms_norm(self, name: str, size: int) -> None:
        self.out[f"{name}.weight"] = ((size,), self.dtype)

    def layer_norm(self, name: str, size: int) -> None:
        self.out[f"{name}.weight"] = ((size,), self.dtype)
        self.out[f"{name}.bias"] = ((size,), self.dtype)

    def embedding(self, name: str, parallel: bool) -> None:
        vocab, hidden = int(self.c["vocab_size"]), int(self.c["hidden_size"])
        if parallel and self.tp > 1:  # optimize_model -> parallelize_embedding before the weights load
            dim = int(self.c.get("embedding_sharding_dim", 0))
            shape = (math.ceil(vocab / self.tp), hidden) if dim == 0 else (vocab, hidden // self.tp)
        else:
            shape = (vocab, hidden)
        self.out[f"{name}.weight"] = (shape, self.dtype)

    def lm_head(self, bias: bool = False) -> None:
        padded = math.ceil(int(self.c["vocab_size"]) / self.tp) * self.tp  # _utils.pad_vocab_size
        self.column("lm_head", int(self.c["hidden_size"]), padded, bias)

    def attention(self, prefix: str, *, bias: bool, dense_bias: bool, qk_layernorm: bool) -> None:
        c = self.c
        heads, hidden = int(c["num_attention_heads"]), int(c["hidden_size"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head = int(c.get("head_size") or hidden // heads)
        if heads % self.tp:
            raise ValueError(f"num_attention_heads {heads} not divisible by tp_size {self.tp} (Attention asserts it)")
        local_heads, local_kv = heads // self.tp, (kv_heads + self.tp - 1) // self.tp  # K/V heads repeat when kv < tp
        self.column(f"{prefix}.qkv", hidden, self.tp * (local_heads + 2 * local_kv) * head, bias)
        self.row(f"{prefix}.dense", self.tp * local_heads * head, hidden, dense_bias)
        if qk_layernorm:
            self.rms_norm(f"{prefix}.q_layernorm", head)
            self.rms_norm(f"{prefix}.k_layernorm", head)
        if self.kv_quant:  # kv_cache_quantize, on every Attention
            self.out[f"{prefix}.kv_cache_scaling_factor"] = ((1,), F32)
            self.out[f"{prefix}.kv_cache_rcp_scaling_factor"] = ((1,), F32)

    def mlp(self, prefix: str, inter: int, act: str, bias: bool, gated: bool) -> None:
        hidden = int(self.c["hidden_size"])
        fc_out = 2 * inter if act in GATED_ACTIVATIONS else inter  # MLP: swiglu's fc holds both halves
        self.column(f"{prefix}.fc", hidden, fc_out, bias)
        if gated:  # GatedMLP: `fc` gets the activation, `gate` is the linear branch
            self.column(f"{prefix}.gate", hidden, inter, bias)
        self.row(f"{prefix}.proj", inter, hidden, bias)

    def moe(self, prefix: str, inter: int, act: str, bias: bool, shared: int = 0) -> None:
        moe, hidden = self.c["moe"], int(self.c["hidden_size"])
        experts = int(moe["num_experts"]) // self.moe_ep
        local = inter // self.moe_tp
        quantized = self._quantized(prefix)  # the MoE module is re-created with quant_mode 0 when excluded
        wdtype = FP8 if quantized else self.dtype
        self.row(f"{prefix}.router", hidden, int(moe["num_experts"]), False, tp=1, dtype=F32)
        fc_rows = 2 * local if act in GATED_ACTIVATIONS else local
        for name, shape in (("fc", (experts, fc_rows, hidden)), ("proj", (experts, hidden, local))):
            self.out[f"{prefix}.{name}.weight"] = (shape, wdtype)
            if bias:
                self.out[f"{prefix}.{name}.bias"] = ((experts, shape[1]), self.dtype)
            if quantized:
                self.out[f"{prefix}.{name}.weights_scaling_factor"] = ((experts, 1), F32)
                self.out[f"{prefix}.{name}.activation_scaling_factor"] = ((1,), F32)
        if shared:  # SharedMoE (Qwen2-MoE): an MLP with the MoE's activation, no bias, and a sigmoid gate [1, H]
            self.mlp(f"{prefix}.shared_expert", shared, act, False, gated=False)
            self.row(f"{prefix}.shared_expert_gate", hidden, 1, False, tp=1)

    # -- stages ------------------------------------------------------------------------------------------------
    def local_layers(self) -> range:
        layers = int(self.c["num_hidden_layers"])
        if layers % self.pp:
            raise NotImplementedError(f"{layers} layers over pp_size {self.pp}: uneven stages are not restated")
        per = layers // self.pp
        return range(per)  # DecoderLayerList is a ModuleList: names count the rank's layers from 0

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp - 1


def _llama(r: _Rank) -> None:
    c, hidden = r.c, int(r.c["hidden_size"])
    if r.first:
        r.embedding("transformer.vocab_embedding", bool(c.get("use_parallel_embedding", False)))
    moe = (c.get("moe") or {}).get("num_experts", 0)
    for i in r.local_layers():
        p = f"transformer.layers.{i}"
        if c.get("use_input_layernorm_in_first_layer", True) or i > 0 or not r.first:
            r.rms_norm(f"{p}.input_layernorm", hidden)
        r.attention(f"{p}.attention", bias=bool(c.get("attn_bias")), dense_bias=bool(c.get("attn_bias")), qk_layernorm=False)
        if moe:
            r.moe(f"{p}.mlp", int(c["intermediate_size"]), str(c["hidden_act"]), bool(c.get("mlp_bias")))
        else:
            r.mlp(f"{p}.mlp", int(c["intermediate_size"]), str(c["hidden_act"]), bool(c.get("mlp_bias")), gated=True)
        r.rms_norm(f"{p}.post_layernorm", hidden)
        if c.get("residual_mlp"):
            raise NotImplementedError("residual_mlp (Arctic) is not restated")
    if r.last:
        if c.get("use_last_layernorm", True):
            r.rms_norm("transformer.ln_f", hidden)
        r.lm_head()


def _qwen(r: _Rank) -> None:
    c, hidden = r.c, int(r.c["hidden_size"])
    qwen_type = c.get("qwen_type", "qwen2")
    if r.first:
        r.embedding("transformer.vocab_embedding", bool(c.get("use_parallel_embedding", False)))
    for i in r.local_layers():
        p = f"transformer.layers.{i}"
        r.rms_norm(f"{p}.input_layernorm", hidden)
        qk = qwen_type in ("qwen3", "qwen3_moe")
        r.attention(f"{p}.attention", bias=bool(c.get("attn_bias", True)), dense_bias=False, qk_layernorm=qk)
        act, bias = str(c["hidden_act"]), bool(c.get("mlp_bias"))
        if (c.get("moe") or {}).get("num_experts", 0):
            shared = int(c.get("moe_shared_expert_intermediate_size") or 0) if qwen_type == "qwen2_moe" else 0
            r.moe(f"{p}.mlp", int(c["moe_intermediate_size"]), act, bias, shared=shared)
        else:
            inter = int(c["intermediate_size"]) // (2 if qwen_type == "qwen" else 1)
            r.mlp(f"{p}.mlp", inter, act, bias, gated=True)
        r.rms_norm(f"{p}.post_layernorm", hidden)
    if r.last:
        r.rms_norm("transformer.ln_f", hidden)
        r.lm_head()


def _gemma(r: _Rank) -> None:
    c, hidden = r.c, int(r.c["hidden_size"])
    gemma23 = c["architecture"] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    if r.first:
        r.embedding("transformer.vocab_embedding", r.tp > 1)  # GemmaConfig ignores use_parallel_embedding
    for i in r.local_layers():
        p = f"transformer.layers.{i}"
        r.rms_norm(f"{p}.input_layernorm", hidden)
        bias = bool(c.get("attn_bias"))
        r.attention(f"{p}.attention", bias=bias, dense_bias=bias, qk_layernorm=c["architecture"] == "Gemma3ForCausalLM")
        r.mlp(f"{p}.mlp", int(c["intermediate_size"]), str(c["hidden_act"]), bool(c.get("mlp_bias")), gated=True)
        if gemma23:  # inter_layernorms: GemmaConfig sets it for Gemma 2 and 3 whatever the file says
            r.rms_norm(f"{p}.pre_feedforward_layernorm", hidden)
            r.rms_norm(f"{p}.post_feedforward_layernorm", hidden)
        r.rms_norm(f"{p}.post_layernorm", hidden)
    if r.last:
        r.rms_norm("transformer.ln_f", hidden)
        r.lm_head()


def _phi3(r: _Rank) -> None:
    c, hidden = r.c, int(r.c["hidden_size"])
    if c["architecture"] != "Phi3ForCausalLM":
        raise NotImplementedError(f"{c['architecture']}: only the dense Phi-3 class is restated")
    if "moe" in c:  # Phi3DecoderLayer switches to MOE when the config has a `moe` attribute at all
        raise NotImplementedError("a Phi-3 config with a `moe` key builds PhiMoE's MOE, not restated")
    r.embedding("transformer.vocab_embedding", bool(c.get("use_parallel_embedding", False)))  # every rank
    for i in r.local_layers():
        p = f"transformer.layers.{i}"
        r.rms_norm(f"{p}.input_layernorm", hidden)
        r.attention(f"{p}.attention", bias=False, dense_bias=False, qk_layernorm=False)
        r.mlp(f"{p}.mlp", int(c["intermediate_size"]), str(c["hidden_act"]), False, gated=False)
        r.rms_norm(f"{p}.post_layernorm", hidden)
    r.rms_norm("transformer.ln_f", hidden)
    r.lm_head()


def _gpt(r: _Rank) -> None:
    c, hidden = r.c, int(r.c["hidden_size"])
    bias = bool(c.get("bias", True))
    if (c.get("moe") or {}).get("num_experts", 0):
        raise NotImplementedError("GPT MoE is not restated")
    if r.first:
        r.embedding("transformer.vocab_embedding", bool(c.get("use_parallel_embedding", False)))
        if c.get("position_embedding_type") == "learned_absolute":
            r.out["transformer.position_embedding.weight"] = ((int(c["max_position_embeddings"]), hidden), r.dtype)
    act = str(c["hidden_act"])
    for i in r.local_layers():
        p = f"transformer.layers.{i}"
        r.layer_norm(f"{p}.input_layernorm", hidden)
        r.attention(f"{p}.attention", bias=bias, dense_bias=bias, qk_layernorm=False)
        if c.get("qk_layernorm") or c.get("inner_layernorm"):
            raise NotImplementedError("GPT qk/inner layernorms (persimmon, kosmos-2) are not restated")
        gated = act in GATED_ACTIVATIONS  # MLPFactory: GatedMLP with the non-gated activation
        inter = int(c["intermediate_size"])
        r.mlp(f"{p}.mlp", inter, {"swiglu": "silu", "gegelu": "gelu"}.get(act, act), bias, gated=gated)
        r.layer_norm(f"{p}.post_layernorm", hidden)
    if r.last:
        r.layer_norm("transformer.ln_f", hidden)
        r.lm_head()


_CLASSES = {"LLaMAForCausalLM": _llama, "QWenForCausalLM": _qwen, "GemmaForCausalLM": _gemma, "Phi3ForCausalLM": _phi3, "GPTForCausalLM": _gpt}


def declared_parameters(config: Mapping[str, Any], rank: int) -> Declared:
    """name -> (shape, dtype) of the Parameters TensorRT-LLM 1.2's class for `config` declares on `rank`."""
    architecture = config.get("architecture")
    if architecture not in MODEL_MAP:
        raise ValueError(f"architecture {architecture!r} is not one of the restated MODEL_MAP entries {sorted(MODEL_MAP)}")
    built = _Rank(config, rank)
    _CLASSES[MODEL_MAP[architecture]](built)
    return built.out


def as_loaded(written: Mapping[str, tuple[Shape, str]], quant_algo: str | None = None) -> Declared:
    """`written` after preprocess_weights' renames: k/v cache scales -> kv_cache_scaling_factor (their max) and
    kv_cache_rcp_scaling_factor added where missing; for FP8, int8 weights viewed as FP8 and the lm_head scales
    dropped when lm_head is not FP8."""
    loaded = dict(written)
    if quant_algo == "FP8":
        loaded = {n: (s, FP8 if n.endswith("weight") and d == "int8" else d) for n, (s, d) in loaded.items()}
    for name in [n for n in loaded if n.endswith(".k_cache_scaling_factor")]:
        v_name = name.replace("k_cache_scaling_factor", "v_cache_scaling_factor")
        if v_name not in loaded:
            raise ValueError(f"{name} without {v_name}: NVIDIA's preprocess_weights asserts on it")
        loaded[name.replace("k_cache_scaling_factor", "kv_cache_scaling_factor")] = loaded.pop(name)
        loaded.pop(v_name)
    for name in [n for n in loaded if n.endswith(".kv_cache_scaling_factor")]:
        loaded.setdefault(name.replace("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor"), loaded[name])
    if quant_algo == "FP8" and "lm_head.weight" in loaded and loaded["lm_head.weight"][1] != FP8:
        loaded.pop("lm_head.weights_scaling_factor", None)
        loaded.pop("lm_head.activation_scaling_factor", None)
    return loaded


def compare(declared: Declared, loaded: Declared) -> dict[str, list[str]]:
    """missing (declared, not written; lm_head may be absent when the embedding is written: load's sharing
    exemption), extra (written, not declared) and mismatched (shape or dtype; NVIDIA's Parameter asserts the shape
    and only warns on the dtype), each sorted."""
    exempt = {"lm_head.weight"} if any(n.endswith("vocab_embedding.weight") for n in loaded) else set()
    return {
        "missing": sorted(set(declared) - set(loaded) - exempt),
        "extra": sorted(set(loaded) - set(declared)),
        "mismatched": sorted(f"{n}: written {loaded[n]}, declared {declared[n]}" for n in set(declared) & set(loaded) if loaded[n] != declared[n]),
    }

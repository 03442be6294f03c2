"""What TensorRT-LLM 1.2's model classes declare for a Medusa or EAGLE-1/2 checkpoint: the parameters (names, per-rank
shapes, dtypes) `PretrainedModel.load` needs, restated as data from NVIDIA's class definitions. Written from reading them,
independently of the project's writers (nothing here imports pipeline/); a test compares a written checkpoint with it in
both directions, so an extra tensor fails too (NVIDIA's loader only logs "Provided but not required tensors").

Read (NVIDIA/TensorRT-LLM, 1.2-era stored versions):
- models/medusa/model.py @ 0249976575050d2c624a5f285683c66de311a3b7: MedusaForCausalLm wraps QWenForCausalLM when
  "qwen" is in config.model_type, else LLaMAForCausalLM, and adds `medusa_heads.{h}` (num_medusa_heads of them) on every
  rank: `medusa_layers.{l}.linear` (num_medusa_layers; ColumnLinear H -> H with bias, tp split) and `lm_head`
  (ColumnLinear H -> pad_vocab_size(vocab_size, tp), no bias); models/medusa/config.py @ 084a8843ce92c0d3: MedusaConfig.
- models/eagle/model.py @ 06255cb759835a9797b656aa5d1dc8f7e75fdca6: EagleForCausalLM(LLaMAForCausalLM) adds on the last
  pp rank `eagle_nets.{i}` (num_eagle_layers): `drafter` = LLaMAModel(eagle_net_config) with mapping tp_size =
  world_size, pp 1, fc_after_embed, no input norm in its first layer, no final norm; and `lm_head` (ColumnLinear H ->
  padded vocab); models/eagle/config.py @ 0382a8acaeebec16: eagle_net_config is a LLaMAConfig.
- models/llama/model.py (1.2-era stored version with fc_after_embed / use_last_layernorm / layer_idx_offset):
  LLaMADecoderLayer (input_layernorm unless layer 0 and not use_input_layernorm_in_first_layer; Attention with
  bias=attn_bias; GatedMLP fc/gate/proj with bias=mlp_bias; post_layernorm), LLaMAModel (vocab_embedding, layers,
  `fc` ColumnLinear 2H -> H with bias when fc_after_embed, ln_f when use_last_layernorm);
  models/qwen/model.py: QWenDecoderLayer (Attention bias=attn_bias, dense_bias=False), QWenModel (always ln_f).
- models/modeling_utils.py (1.2-era): PretrainedModel.__post_init__ runs quantize(model, config.quantization) and then
  optimize_model(use_parallel_embedding=config.use_parallel_embedding), whose parallelize_embedding splits EVERY
  Embedding without a tp group (the EagleNets' too) over config.mapping.tp_size along embedding_sharding_dim;
  preprocess_weights folds `k_cache_scaling_factor` / `v_cache_scaling_factor` into `kv_cache_scaling_factor` (their
  max) and derives `kv_cache_rcp_scaling_factor` before load.
- quantization/quantize.py (1.2-era): fp8_quantize swaps every ColumnLinear / RowLinear whose module name matches no
  exclude_modules pattern (fnmatchcase; None means ['*lm_head', '*router', '*vocab_embedding', '*position_embedding',
  '*block_embedding', '*shared_expert_gate']) for FP8Linear / FP8RowLinear (fp8 weight, float32 [1]
  activation_scaling_factor and weights_scaling_factor); kv_cache_quantize gives every Attention float32 [1]
  kv_cache_scaling_factor and kv_cache_rcp_scaling_factor, excluded or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

Declared = dict[str, tuple[tuple[int, ...], str]]  # parameter name -> (shape on this rank, torch dtype name)

NVIDIA_DEFAULT_EXCLUDES = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding", "*shared_expert_gate")
_FLOAT32 = "float32"
_FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class _Linear:
    name: str
    out_features: int  # over all ranks
    in_features: int
    bias: bool
    column: bool  # ColumnLinear (rows split) or RowLinear (columns split)


@dataclass(frozen=True)
class _Module:
    """The modules one class declares, before quantize(): Linears, norms [H], embeddings [V, H], attentions."""

    linears: tuple[_Linear, ...] = ()
    norms: tuple[tuple[str, int], ...] = ()
    embeddings: tuple[tuple[str, int, int], ...] = ()
    attentions: tuple[str, ...] = ()

    def __add__(self, other: _Module) -> _Module:
        return _Module(self.linears + other.linears, self.norms + other.norms, self.embeddings + other.embeddings, self.attentions + other.attentions)


def pad_vocab_size(vocab: int, tp: int) -> int:
    return math.ceil(vocab / tp) * tp


def _decoder(config: dict[str, Any], prefix: str, *, qwen: bool, tp: int, pp_rank: int, pp: int) -> _Module:
    """LLaMAModel / QWenModel under `prefix` (the modules of this pipeline stage)."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head = int(config.get("head_size") or config.get("head_dim") or hidden // heads)
    inter = int(config.get("intermediate_size") or 4 * hidden)
    attn_bias, mlp_bias = bool(config.get("attn_bias", False)), bool(config.get("mlp_bias", False))
    # the qkv rows a rank holds: its query heads, and its kv heads (replicated when kv_heads < tp)
    qkv_rows = (heads // tp + 2 * max(kv_heads // tp, 1)) * head * tp
    layers = int(config["num_hidden_layers"])
    per_stage = layers // pp
    module = _Module()
    if pp_rank == 0:
        module += _Module(embeddings=((f"{prefix}.vocab_embedding", int(config["vocab_size"]), hidden),))
    for local in range(per_stage):
        p = f"{prefix}.layers.{local}"
        first = pp_rank == 0 and local == 0
        norms = [(f"{p}.post_layernorm", hidden)]
        if qwen or not first or config.get("use_input_layernorm_in_first_layer", True):
            norms.append((f"{p}.input_layernorm", hidden))
        linears = (
            _Linear(f"{p}.attention.qkv", qkv_rows, hidden, attn_bias, True),
            _Linear(f"{p}.attention.dense", hidden, heads * head, attn_bias and not qwen, False),
            _Linear(f"{p}.mlp.fc", inter, hidden, mlp_bias, True),
            _Linear(f"{p}.mlp.gate", inter, hidden, mlp_bias, True),
            _Linear(f"{p}.mlp.proj", hidden, inter, mlp_bias, False),
        )
        module += _Module(linears=linears, norms=tuple(norms), attentions=(f"{p}.attention",))
    if config.get("fc_after_embed"):
        module += _Module(linears=(_Linear(f"{prefix}.fc", hidden, 2 * hidden, True, True),))
    if pp_rank == pp - 1 and (qwen or config.get("use_last_layernorm", True)):
        module += _Module(norms=((f"{prefix}.ln_f", hidden),))
    return module


def _lm_head(name: str, config: dict[str, Any], tp: int) -> _Module:
    return _Module(linears=(_Linear(name, pad_vocab_size(int(config["vocab_size"]), tp), int(config["hidden_size"]), False, True),))


def _mapping(config: dict[str, Any], rank: int) -> tuple[int, int, int, int]:
    mapping = config.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    return tp, rank % tp, pp, rank // tp


def medusa_declared(config: dict[str, Any], rank: int) -> Declared:
    """MedusaForCausalLm's parameters on `rank` for a Medusa checkpoint's config.json."""
    tp, tp_rank, pp, pp_rank = _mapping(config, rank)
    qwen = "qwen" in str(config.get("model_type", "")).lower()
    module = _decoder(config, "transformer", qwen=qwen, tp=tp, pp_rank=pp_rank, pp=pp)
    if pp_rank == pp - 1:
        module += _lm_head("lm_head", config, tp)
    hidden = int(config["hidden_size"])
    for h in range(int(config["num_medusa_heads"])):
        layers = tuple(_Linear(f"medusa_heads.{h}.medusa_layers.{j}.linear", hidden, hidden, True, True) for j in range(int(config["num_medusa_layers"])))
        module += _Module(linears=layers) + _lm_head(f"medusa_heads.{h}.lm_head", config, tp)
    return _declare(module, config, tp, tp_rank)


def eagle_declared(config: dict[str, Any], rank: int) -> Declared:
    """EagleForCausalLM's parameters on `rank` for an EAGLE-1/2 checkpoint's config.json."""
    tp, tp_rank, pp, pp_rank = _mapping(config, rank)
    module = _decoder(config, "transformer", qwen=False, tp=tp, pp_rank=pp_rank, pp=pp)
    if pp_rank == pp - 1:
        module += _lm_head("lm_head", config, tp)
        world = tp * pp
        net = {**config["eagle_net_config"], "fc_after_embed": True, "use_input_layernorm_in_first_layer": False, "use_last_layernorm": False}
        for i in range(int(config["num_eagle_layers"])):
            module += _decoder(net, f"eagle_nets.{i}.drafter", qwen=False, tp=world, pp_rank=0, pp=1)
            module += _lm_head(f"eagle_nets.{i}.lm_head", net, world)
    return _declare(module, config, tp, tp_rank)


def _declare(module: _Module, config: dict[str, Any], tp: int, tp_rank: int) -> Declared:
    """The module's parameters after PretrainedModel.__post_init__ (quantize, then parallelize_embedding)."""
    dtype = str(config["dtype"])
    quantization = config.get("quantization") or {}
    fp8 = quantization.get("quant_algo") == "FP8"
    if quantization.get("quant_algo") not in (None, "FP8"):
        raise ValueError(f"this restatement covers 16-bit and FP8 checkpoints, not quant_algo {quantization['quant_algo']}")
    excludes = quantization.get("exclude_modules")
    excludes = NVIDIA_DEFAULT_EXCLUDES if excludes is None else tuple(excludes)
    out: Declared = {}
    for linear in module.linears:
        if linear.column:
            if linear.out_features % tp:
                raise ValueError(f"{linear.name}: {linear.out_features} rows do not split over tp {tp}")
            weight, bias = (linear.out_features // tp, linear.in_features), linear.out_features // tp
        else:
            weight, bias = (linear.out_features, linear.in_features // tp), linear.out_features
        quantized = fp8 and not any(fnmatchcase(linear.name, pattern) for pattern in excludes)
        out[f"{linear.name}.weight"] = (weight, _FP8 if quantized else dtype)
        if linear.bias:
            out[f"{linear.name}.bias"] = ((bias,), dtype)
        if quantized:
            out[f"{linear.name}.activation_scaling_factor"] = ((1,), _FLOAT32)
            out[f"{linear.name}.weights_scaling_factor"] = ((1,), _FLOAT32)
    out.update({f"{name}.weight": ((size,), dtype) for name, size in module.norms})
    parallel = bool(config.get("use_parallel_embedding", False)) and tp > 1
    by_rows = int(config.get("embedding_sharding_dim", 0)) == 0
    for name, vocab, hidden in module.embeddings:
        shape = (math.ceil(vocab / tp), hidden) if parallel and by_rows else (vocab, math.ceil(hidden / tp)) if parallel else (vocab, hidden)
        out[f"{name}.weight"] = (shape, dtype)
    if quantization.get("kv_cache_quant_algo") is not None:
        for name in module.attentions:
            out[f"{name}.kv_cache_scaling_factor"] = ((1,), _FLOAT32)
            out[f"{name}.kv_cache_rcp_scaling_factor"] = ((1,), _FLOAT32)
    return out


def loaded_view(tensors: dict[str, Any]) -> Declared:
    """A checkpoint rank's tensors as preprocess_weights hands them to load: k/v cache scales folded into the kv one,
    its reciprocal derived (name -> (shape, dtype name))."""
    view: Declared = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors.items()}
    for name in [n for n in view if n.endswith(".k_cache_scaling_factor")]:
        v_name = name.replace("k_cache_scaling_factor", "v_cache_scaling_factor")
        if v_name not in view:
            raise ValueError(f"{name} without {v_name}: NVIDIA's preprocess_weights asserts the pair")
        view[name.replace("k_cache_scaling_factor", "kv_cache_scaling_factor")] = view.pop(name)
        del view[v_name]
    for name in [n for n in view if n.endswith(".kv_cache_scaling_factor")]:
        view.setdefault(name.replace("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor"), view[name])
    return view


def differences(written: Declared, declared: Declared) -> list[str]:
    """Every way a written rank differs from the declared set: missing, extra, wrong shape or dtype (empty: equal)."""
    problems = [f"missing {name} {declared[name]}" for name in sorted(set(declared) - set(written))]
    problems += [f"extra (not declared) {name} {written[name]}" for name in sorted(set(written) - set(declared))]
    problems += [
        f"{name}: written {written[name]}, declared {declared[name]}" for name in sorted(set(written) & set(declared)) if written[name] != declared[name]
    ]
    return problems

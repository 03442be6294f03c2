"""Checks of build.lora's adapters against the model they will run on, without loading a tensor.

Each adapter directory (Hugging Face PEFT) is read through its `adapter_config.json` and the header of its
`adapter_model.safetensors`: the modules it trains must be modules of the model, every lora_A / lora_B matrix
must have the shape the model's layer gives it ([rank, in_features] and [out_features, rank]), and its rank must
fit the engine (build.lora.max_rank) and the LoRA cache (serve.lora.cache_max_adapter_size). The model's
shapes come from its own safetensors headers, or, for a config-only model directory, from config.json's
hidden / intermediate / head sizes. NaN or Inf in the weights cannot be seen without reading them: the engine
refuses those at run time.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.config.lora_adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PICKLED_WEIGHTS, AdapterError, AdapterInfo, engine_target_modules, read_adapter
from pipeline.config.model_info import ModelInfo
from pipeline.config.spec import Spec
from pipeline.config.weight_checks import WeightHeaderError, safetensors_header, weight_shapes

Issue = tuple[tuple[str | int, ...], str]

# PEFT's key of one LoRA matrix: base_model.model.<module path>.lora_A.weight (an adapter name may precede .weight).
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<matrix>[AB])(?:\.[^.]+)?\.weight$")
_LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<name>[a-z_]+)$")
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# serve.lora.cache_max_adapter_size may not be below build.lora.max_rank (the spec's rules): max_rank bounds both
_RANK_LIMIT = "build.lora.max_rank ({}), the largest rank the engine and its LoRA cache take"


def check_lora_adapters(spec: Spec, info: ModelInfo) -> list[Issue]:
    """Every adapter of build.lora against the engine's LoRA settings and the model: TensorRT-LLM applies LoRA only with an
    engine built with --lora_plugin, its target modules and a max rank that covers them, and ignores weights in another dtype."""
    lora = spec.build.lora
    if lora is None:
        return []
    issues: list[Issue] = []
    model_shapes = _model_shapes(info)
    declared = [module.value for module in lora.target_modules]
    for index, directory in enumerate(lora.adapter_dirs):
        where = ("build", "lora", "adapter_dirs", index)
        try:
            adapter = read_adapter(Path(directory))
        except AdapterError as exc:
            issues.append((where, str(exc)))
            continue
        config_file = adapter.path / ADAPTER_CONFIG
        if adapter.pickled_only:
            issues.append(
                (
                    where,
                    f"{adapter.path} holds only {PICKLED_WEIGHTS} (pickled weights, which can run code when "
                    f"loaded): refused; save the adapter with safetensors ({ADAPTER_WEIGHTS}: "
                    "model.save_pretrained(dir, safe_serialization=True))",
                )
            )
        if adapter.rank > lora.max_rank:
            issues.append((where, f"the adapter's rank r = {adapter.rank} ({config_file}) exceeds {_RANK_LIMIT.format(lora.max_rank)}"))
        wanted = declared or _first_adapter_modules(lora.adapter_dirs)
        missing = [module for module in adapter.target_modules if module not in wanted]
        if wanted and missing:
            source = "build.lora.target_modules" if declared else "the first adapter's target_modules"
            issues.append(
                (
                    where,
                    f"the adapter trains {', '.join(missing)} ({config_file}), which {source} "
                    f"({', '.join(wanted)}) does not list: the engine would silently skip them",
                )
            )
        if adapter.has_weights:
            issues += [(where, message) for message in _tensor_issues(adapter, info, model_shapes, lora.max_rank)]
    return issues


def _first_adapter_modules(adapter_dirs: tuple[str, ...]) -> list[str]:
    try:
        return list(engine_target_modules((), adapter_dirs))
    except AdapterError:
        return []


def _model_shapes(info: ModelInfo) -> dict[str, list[int]] | None:
    """The model's tensor shapes by name; None when it has no readable safetensors (its own checks report why)."""
    if not info.weight_files:
        return None
    try:
        return weight_shapes(info)
    except (WeightHeaderError, OSError):
        return None


def _tensor_issues(adapter: AdapterInfo, info: ModelInfo, model_shapes: dict[str, list[int]] | None, max_rank: int) -> list[str]:
    weights = adapter.path / ADAPTER_WEIGHTS
    try:
        header = safetensors_header(weights)
    except WeightHeaderError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{weights}: cannot read it ({type(exc).__name__}: {exc})"]
    matrices: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for key, entry in header.items():
        match = _LORA_KEY.match(key)
        if match is None or not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            continue  # metadata, or tensors TensorRT-LLM does not apply as low-rank updates
        matrices.setdefault(match.group("module"), {})[match.group("matrix")] = (key, entry["shape"])
    if not matrices:
        return [
            f"{weights}: holds no lora_A / lora_B matrix (keys like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight): not a PEFT LoRA adapter"
        ]
    issues: list[str] = []
    for module, pair in sorted(matrices.items()):
        issues += _module_issues(weights, module, pair, adapter, info, model_shapes, max_rank)
        if len(issues) >= 5:  # one wrong adapter repeats the same fault per layer: the first few say it
            return issues
    return issues


def _module_issues(
    weights: Path,
    module: str,
    pair: dict[str, tuple[str, list[int]]],
    adapter: AdapterInfo,
    info: ModelInfo,
    model_shapes: dict[str, list[int]] | None,
    max_rank: int,
) -> list[str]:
    if set(pair) != {"A", "B"}:
        have, lacking = next(iter(pair)), "B" if "A" in pair else "A"
        return [f"{weights}: {pair[have][0]} has no lora_{lacking} partner for module {module}"]
    (a_key, a_shape), (b_key, b_shape) = pair["A"], pair["B"]
    if len(a_shape) != 2 or len(b_shape) != 2:
        return [f"{weights}: {a_key} {a_shape} and {b_key} {b_shape} must both be matrices"]
    rank = a_shape[0]
    if b_shape[1] != rank:
        return [f"{weights}: {a_key} has rank {rank} (shape {a_shape}) but {b_key} has {b_shape[1]} (shape {b_shape})"]
    issues = []
    if rank > max_rank:
        issues.append(f"{weights}: {a_key} has rank {rank} (shape {a_shape}), above {_RANK_LIMIT.format(max_rank)}")
    elif rank != adapter.rank and not adapter.varies_rank:
        issues.append(f"{weights}: {a_key} has rank {rank} (shape {a_shape}), but {adapter.path / ADAPTER_CONFIG} says r = {adapter.rank}")
    expected = _expected_shape(module, info, model_shapes)
    layer = _LAYER_MODULE.search(module)
    if expected is None and model_shapes is None and layer is not None and int(layer.group("layer")) >= info.num_layers:
        issues.append(
            f"{weights}: {a_key} adapts layer {layer.group('layer')}, but the model has num_hidden_layers "
            f"{info.num_layers} ({info.path / 'config.json'}): the adapter was trained for another model"
        )
    elif expected is None and model_shapes is not None:
        issues.append(
            f"{weights}: {a_key} adapts {module}, which the model ({info.path}) does not have "
            f"(no tensor {module}.weight): the adapter was trained for another model"
        )
    if expected is None:
        return issues
    (out_features, in_features), origin = expected
    if a_shape[1] != in_features or b_shape[0] != out_features:
        issues.append(
            f"{weights}: {a_key} {a_shape} / {b_key} {b_shape} do not fit {module} of the model, "
            f"[out_features {out_features}, in_features {in_features}] ({origin}); expected "
            f"[{rank}, {in_features}] and [{out_features}, {rank}]: the adapter was trained for another model"
        )
    return issues


def _expected_shape(module: str, info: ModelInfo, model_shapes: dict[str, list[int]] | None):
    """([out_features, in_features], where it was read) of the model's linear layer `module`; None: it has none."""
    if model_shapes is not None:
        shape = model_shapes.get(f"{module}.weight")
        if shape is None or len(shape) != 2:
            return None
        return (shape[0], shape[1]), f"{module}.weight in {info.path}"
    match = _LAYER_MODULE.search(module)
    if match is None or int(match.group("layer")) >= info.num_layers:
        return None
    name = match.group("name")
    if name in _ATTENTION and info.mla is not None:
        return None  # multi-head latent attention has other projections
    heads, kv = info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    sizes = {
        "q_proj": ((heads, info.hidden_size), "num_attention_heads × head_dim, hidden_size"),
        "k_proj": ((kv, info.hidden_size), "num_key_value_heads × head_dim, hidden_size"),
        "v_proj": ((kv, info.hidden_size), "num_key_value_heads × head_dim, hidden_size"),
        "o_proj": ((info.hidden_size, heads), "hidden_size, num_attention_heads × head_dim"),
        "gate_proj": ((info.intermediate_size, info.hidden_size), "intermediate_size, hidden_size"),
        "up_proj": ((info.intermediate_size, info.hidden_size), "intermediate_size, hidden_size"),
        "down_proj": ((info.hidden_size, info.intermediate_size), "hidden_size, intermediate_size"),
        "qkv_proj": ((heads + 2 * kv, info.hidden_size), "(num_attention_heads + 2 × num_key_value_heads) × head_dim, hidden_size"),
        "gate_up_proj": ((2 * info.intermediate_size, info.hidden_size), "2 × intermediate_size, hidden_size"),
    }
    dense_mlp = info.moe is None or int(match.group("layer")) < info.moe.dense_layers
    if name not in sizes or (name not in _ATTENTION and not dense_mlp):
        return None
    expected, fields = sizes[name]
    return expected, f"{fields} in {info.path / 'config.json'}"

"""Checks at validate of an EAGLE-1/2 draft checkpoint (the engine target's build.speculative.eagle.heads) against the
model, from its config.json and safetensors headers (no torch, no safetensors).

The layout is SafeAILab EAGLE's (the yuhuili/EAGLE-* checkpoints), which examples/eagle/convert_checkpoint.py reads as a
Llama checkpoint with its `eagle_nets.{i}` and `drafter` prefixes mapped to nothing: fc.weight [H, 2H] and fc.bias [H]
(the hidden state and the token embedding, concatenated, back to H), embed_tokens.weight [V, H], and per draft layer l
layers.{l}.self_attn.{q,k,v,o}_proj.weight, layers.{l}.mlp.{gate,up,down}_proj.weight,
layers.{l}.post_attention_layernorm.weight, and layers.{l}.input_layernorm.weight for l >= 1 (TensorRT-LLM's EagleNet
runs its first layer without an input norm, use_input_layernorm_in_first_layer False, and has no final norm).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config.model_info import ModelInfo
from pipeline.config.weight_checks import WeightHeaderError, read_json_object, safetensors_header

EAGLE_HEADS = ("build", "speculative", "eagle", "heads")
_FLOAT_DTYPES = ("F16", "BF16", "F32")
_CONFIG_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def eagle_draft_shapes(config: dict, vocab: int) -> dict[str, list[int]]:
    """Every tensor an EAGLE-1/2 checkpoint with this config.json must hold, and its shape."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    shapes = {"fc.weight": [hidden, 2 * hidden], "fc.bias": [hidden], "embed_tokens.weight": [vocab, hidden]}
    for layer in range(int(config["num_hidden_layers"])):
        prefix = f"layers.{layer}"
        shapes.update(
            {
                f"{prefix}.self_attn.q_proj.weight": [heads * head_dim, hidden],
                f"{prefix}.self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
                f"{prefix}.self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
                f"{prefix}.self_attn.o_proj.weight": [hidden, heads * head_dim],
                f"{prefix}.mlp.gate_proj.weight": [inter, hidden],
                f"{prefix}.mlp.up_proj.weight": [inter, hidden],
                f"{prefix}.mlp.down_proj.weight": [hidden, inter],
                f"{prefix}.post_attention_layernorm.weight": [hidden],
            }
        )
        if layer > 0:
            shapes[f"{prefix}.input_layernorm.weight"] = [hidden]
    return shapes


def eagle_draft_issues(heads: Path, info: ModelInfo, tp_size: int) -> list[str]:
    """What keeps `heads` from being this model's EAGLE-1/2 draft checkpoint (empty: nothing)."""
    config, problem = _config(heads)
    if problem is not None:
        return [problem]
    files = sorted(heads.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in heads.glob("*.bin")) + sorted(p.name for p in heads.glob("*.pt"))
        why = f" ({', '.join(pickled)} are pickles, which can run code when loaded)" if pickled else ""
        return [f"{heads} has no *.safetensors{why}: only safetensors are accepted"]
    issues = []
    for key, model_value in (("hidden_size", info.hidden_size), ("vocab_size", info.vocab_size)):
        value = config.get(key)
        if value is not None and value != model_value:
            issues.append(
                f"{heads / 'config.json'} {key} ({value}) differs from the model's ({model_value}, "
                f"{info.path / 'config.json'}): an EAGLE layer reads the model's hidden states and tokens, so "
                "it must be trained for this model"
            )
    if config.get("hidden_act", "silu") != "silu":
        issues.append(
            f"{heads / 'config.json'} hidden_act {config['hidden_act']!r}: TensorRT-LLM's EAGLE example builds "
            "the draft layer with silu (convert_checkpoint.py --hidden_act default)"
        )
    if int(config["num_attention_heads"]) % tp_size:
        issues.append(
            f"{heads / 'config.json'} num_attention_heads ({config['num_attention_heads']}) is not divisible by "
            f"build.tp_size ({tp_size}): TensorRT-LLM splits the draft layer over every rank"
        )
    return issues or _tensor_issues(files, eagle_draft_shapes(config, info.vocab_size))


def _config(heads: Path) -> tuple[dict, str | None]:
    if not heads.is_dir():
        return {}, f"EAGLE draft checkpoint directory not found: {heads}"
    config, problem = read_json_object(heads / "config.json")
    if problem is not None:
        return {}, f"{heads} is not an EAGLE-1/2 draft checkpoint directory: {problem}"
    architectures = " ".join(str(a) for a in config.get("architectures") or [])
    if "draft_vocab_size" in config or "eagle3" in architectures.lower():
        return {}, (
            f"{heads} is an EAGLE-3 checkpoint (draft_vocab_size or an Eagle3 architecture in its config.json): "
            "build.target engine builds EAGLE-1/2 (trtllm-build's EagleForCausalLM); EAGLE-3 runs on target llmapi"
        )
    for key in _CONFIG_INTS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return {}, f"{heads / 'config.json'} {key} must be an int >= 1, got {value!r}"
    return config, None


def _tensor_issues(files: list[Path], expected: dict[str, list[int]]) -> list[str]:
    header: dict = {}
    try:
        for path in files:
            header.update({key: (path, entry) for key, entry in safetensors_header(path).items() if key != "__metadata__"})
    except (OSError, WeightHeaderError) as exc:
        return [str(exc)]
    missing = [key for key in expected if key not in header]
    if missing:
        where = files[0].parent
        return [
            f"{where} has no tensor {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''} (SafeAILab EAGLE's "
            "layout: fc.weight/bias, embed_tokens.weight, layers.{l}.* for the num_hidden_layers of its config.json)"
        ]
    issues = []
    for key, shape in expected.items():
        path, entry = header[key]
        if not isinstance(entry, dict) or entry.get("shape") != shape:
            got = entry.get("shape") if isinstance(entry, dict) else entry
            issues.append(f"{path} {key} has shape {got}, expected {shape} (its config.json and the model's vocab_size)")
        elif entry.get("dtype") not in _FLOAT_DTYPES:
            issues.append(f"{path} {key} has dtype {entry.get('dtype')}: an EAGLE draft layer is float16, bfloat16 or float32")
    return issues

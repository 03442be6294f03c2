"""The shipped Medusa heads of the default model (models/tiny-stdlib-llama-medusa, scripts/train_medusa_heads.py).

The file has exactly the Medusa checkpoint layout (the one TensorRT-LLM's Medusa conversion reads) in float16; its
config.json agrees with the tensors and with the base model; the heads, run by a forward written here from the layout
(not the trainer's), reproduce the accuracy recorded in training_stats.json, so the file is what was measured."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.config.weight_checks import safetensors_header
from tests.conftest import DEFAULT_MODEL, REPO

HEADS_DIR = REPO / "models" / "tiny-stdlib-llama-medusa"
HEADS_FILE = HEADS_DIR / "medusa_lm_head.safetensors"
CONFIG = json.loads((HEADS_DIR / "config.json").read_text())
STATS = json.loads((HEADS_DIR / "training_stats.json").read_text())
BASE = json.loads((DEFAULT_MODEL / "config.json").read_text())


def _contract_keys(num_heads: int, num_layers: int) -> set[str]:
    keys = set()
    for h in range(num_heads):
        keys |= {f"{h}.{layer}.linear.{part}" for layer in range(num_layers) for part in ("weight", "bias")}
        keys.add(f"{h}.{num_layers}.weight")
    return keys


def test_the_file_holds_exactly_the_medusa_layout_in_float16():
    header = {key: entry for key, entry in safetensors_header(HEADS_FILE).items() if key != "__metadata__"}
    heads, layers, hidden, vocab = (CONFIG[key] for key in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"))
    assert (heads, layers) == (4, 1)
    assert set(header) == _contract_keys(heads, layers)
    assert {entry["dtype"] for entry in header.values()} == {"F16"}
    for key, entry in header.items():
        expected = [vocab, hidden] if key.endswith(f".{layers}.weight") else [hidden, hidden] if key.endswith("linear.weight") else [hidden]
        assert entry["shape"] == expected, key
    assert os.path.getsize(HEADS_FILE) == STATS["safetensors_bytes"] < 9_500_000


def test_the_config_agrees_with_the_base_model_and_recommends_a_tree_the_heads_can_follow():
    assert CONFIG["hidden_size"] == BASE["hidden_size"] and CONFIG["vocab_size"] == BASE["vocab_size"]
    assert CONFIG["medusa_hidden_act"] == "silu" and CONFIG["base_model_name_or_path"] == DEFAULT_MODEL.name
    choices = CONFIG["medusa_choices"]
    nodes = {tuple(node) for node in choices}
    assert len(nodes) == len(choices) == STATS["recommended_budget"]
    assert all(1 <= len(node) <= CONFIG["medusa_num_heads"] and min(node) >= 0 for node in choices)
    assert all(tuple(node[:depth]) in nodes for node in choices for depth in range(1, len(node)))
    assert choices == STATS["trees"][str(STATS["recommended_budget"])]["medusa_choices"]


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _heads_as_tensorrt_llm_reads_them() -> list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]]:
    """Per head, its residual layers' (weight, bias) and its lm_head, looked up by the names TensorRT-LLM's
    load_medusa_hf uses for medusa_num_heads x medusa_num_layers; every tensor in the file is consumed."""
    state = safetensors_torch.load_file(str(HEADS_FILE))
    layers = CONFIG["medusa_num_layers"]
    heads, used = [], set()
    for h in range(CONFIG["medusa_num_heads"]):
        residual = []
        for layer in range(layers):
            residual.append((state[f"{h}.{layer}.linear.weight"].float(), state[f"{h}.{layer}.linear.bias"].float()))
            used |= {f"{h}.{layer}.linear.weight", f"{h}.{layer}.linear.bias"}
        heads.append((residual, state[f"{h}.{layers}.weight"].float()))
        used.add(f"{h}.{layers}.weight")
    assert used == set(state)
    return heads


def test_the_heads_reproduce_the_recorded_head0_accuracy_on_heldout_text():
    check = STATS["check"]
    tok = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_MODEL), local_files_only=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), local_files_only=True, dtype=torch.float32).eval()
    text = (REPO / "data" / "heldout" / "stdlib_heldout.txt").read_text(encoding="utf-8")
    stream = torch.tensor([BASE["bos_token_id"]] + tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)
    seq_len = check["seq_len"]
    windows = stream[: check["windows"] * seq_len].reshape(check["windows"], seq_len)
    read = {}
    hook = base.lm_head.register_forward_hook(lambda module, inputs, output: read.update(hidden=inputs[0]))
    with torch.no_grad():
        base_logits = base(input_ids=windows).logits
    hook.remove()
    hidden = read["hidden"]  # what the base lm_head reads: the last hidden state after the final norm
    assert torch.allclose(hidden @ base.lm_head.weight.T, base_logits, atol=1e-4)
    (residual, lm_head), *_ = _heads_as_tensorrt_llm_reads_them()
    x = hidden[:, :-2]
    for weight, bias in residual:
        x = x + torch.nn.functional.silu(x @ weight.T + bias)
    right = (x @ lm_head.T).argmax(-1) == windows[:, 2:]  # head 0 at position t guesses token t+2
    assert right.numel() == check["positions"]
    assert float(right.float().mean()) == pytest.approx(check["head0_top1"], abs=0.003)

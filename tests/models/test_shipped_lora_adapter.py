"""The shipped LoRA adapter of the default model (models/tiny-stdlib-llama-turtle-lora, scripts/train_lora_adapter.py):
a small float16 PEFT adapter on every linear layer that loads with transformers + peft, lowers the loss on the held-out
part of the slice it was trained on (a few sequences, against the base model), and passes `validate` on the cpu target."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipeline.config.lora_adapters import read_adapter
from pipeline.config.weight_checks import safetensors_header
from tests.conftest import BUILD_CONFIGS, DEFAULT_MODEL, REPO
from tests.support.script_modules import import_script

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ADAPTER = REPO / "models" / "tiny-stdlib-llama-turtle-lora"
RECORD = json.loads((ADAPTER / "training_record.json").read_text())


@pytest.fixture(scope="module")
def script():
    return import_script("train_lora_adapter")


def test_the_adapter_lowers_the_loss_on_the_held_out_part_of_its_slice(script):
    heldout = (REPO / RECORD["data"]["source"]).read_text(encoding="utf-8")
    _, evaluation, first_line = script.data_slice(heldout, RECORD["data"]["file"], RECORD["data"]["eval_fraction"])
    assert hashlib.sha256(evaluation.encode()).hexdigest() == RECORD["data"]["eval_sha256"]  # the slice it was measured on
    assert first_line == RECORD["data"]["eval_first_line"]
    tok = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_MODEL), local_files_only=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), local_files_only=True, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(ADAPTER)).eval()
    base_nll, adapter_nll = script.base_and_adapter_nll(model, script.token_stream(tok, evaluation), max_windows=4)
    # the record: 4.74 -> 3.71 nats/token over the whole tail (8,115 tokens); the first 4 windows drop alike
    assert adapter_nll < base_nll - 0.5, (base_nll, adapter_nll)


def test_the_adapter_is_a_small_float16_peft_adapter_of_every_linear_layer():
    header = {key: entry for key, entry in safetensors_header(ADAPTER / "adapter_model.safetensors").items() if key != "__metadata__"}
    assert len(header) == 4 * 7 * 2  # layers × modules × (lora_A, lora_B)
    assert {entry["dtype"] for entry in header.values()} == {"F16"}  # the default model's dtype
    assert header["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]["shape"] == [128, 8]
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 400_000
    adapter = read_adapter(ADAPTER)
    assert adapter.rank == RECORD["rank"] == 8
    assert list(adapter.target_modules) == RECORD["trtllm_modules"] and len(adapter.target_modules) == 7


def test_the_default_model_validates_with_the_adapter():
    from pipeline.config.loader import load_config

    loaded = load_config(BUILD_CONFIGS / "tiny-cpu.yaml", ["build.lora.adapter_dirs=[../models/tiny-stdlib-llama-turtle-lora]"])
    assert loaded.spec.build.lora.adapter_dirs == (str(ADAPTER),)

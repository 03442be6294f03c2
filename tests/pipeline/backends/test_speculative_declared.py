"""The Medusa and EAGLE checkpoints the engine target writes hold exactly what TensorRT-LLM 1.2's MedusaForCausalLm and
EagleForCausalLM declare for their config.json (tests/support/trtllm_declared_heads.py, restated from NVIDIA's classes):
no tensor missing, none extra, every shape and dtype as the class sizes it, on every rank, at TP 1 and 2.

The base checkpoints are real ones: tiny random Llama / Qwen2 models exported by ModelOpt (16-bit, or FP8 weights with
an FP8 KV cache) and converted by the project's converter; the heads are random ones in the contracts' layouts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.eagle_draft import write_eagle_draft
from tests.support.medusa_heads import write_medusa_heads
from tests.support.trtllm_declared_heads import differences, eagle_declared, loaded_view, medusa_declared
from tests.support.unified_exports import convert, quantize_and_export

torch = pytest.importorskip("torch")
pytest.importorskip("modelopt")

HIDDEN, INTER, VOCAB = 64, 96, 250
EAGLE_TREE = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(family, algo, vocab) -> a unified checkpoint of a tiny random model, made once per module."""
    root = tmp_path_factory.mktemp("declared")
    made: dict[tuple[str, str, int], Path] = {}

    def get(family: str, algo: str, vocab: int = VOCAB) -> Path:
        if (family, algo, vocab) not in made:
            made[family, algo, vocab] = _export(family, algo, vocab, root / f"{family}-{algo}-{vocab}")
        return made[family, algo, vocab]

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield get
    torch.set_num_threads(previous)


def _export(family: str, algo: str, vocab: int, directory: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        family, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.architectures = [type(model).__name__]
    return quantize_and_export(model, algo, vocab, directory)


def _base(unified: Path, out: Path, tp: int, pp: int = 1) -> Path:
    convert(unified, out, tp, pp)
    return out


def _assert_declared(checkpoint: Path, declared_for) -> int:
    """Every rank of `checkpoint` against the declared set; returns the number of tensors compared."""
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    ranks = int(config["mapping"]["tp_size"]) * int(config["mapping"].get("pp_size", 1))
    compared = 0
    for rank in range(ranks):
        written = loaded_view(load_file(str(checkpoint / f"rank{rank}.safetensors")))
        declared = declared_for(config, rank)
        assert differences(written, declared) == [], f"rank {rank} differs from {config['architecture']}'s declaration"
        compared += len(declared)
    return compared


# -- Medusa ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("algo", ["none", "fp8"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_medusa_checkpoint_is_what_medusaforcausallm_declares(exports, tmp_path, family, algo, tp):
    from pipeline.backends.engine.medusa_checkpoint import write_medusa_checkpoint

    base = _base(exports(family, algo), tmp_path / "base", tp)
    heads = write_medusa_heads(tmp_path / "heads", num_heads=3, num_layers=2, hidden=HIDDEN, vocab=VOCAB)
    config = write_medusa_checkpoint(base, heads, tmp_path / "medusa", max_draft_len=7)
    assert config["architecture"] == "MedusaForCausalLM" and ("qwen" in config["model_type"]) == (family == "qwen2")
    assert _assert_declared(tmp_path / "medusa", medusa_declared) > 0


def test_medusa_heads_on_every_pipeline_stage_span_the_padded_vocabulary(exports, tmp_path):
    """MedusaForCausalLm builds its heads on every rank with pad_vocab_size(vocab, tp) rows; a stage without the base's
    lm_head (pp rank 0) still sizes them so."""
    from pipeline.backends.engine.medusa_checkpoint import write_medusa_checkpoint

    base = _base(exports("llama", "none", vocab=VOCAB + 1), tmp_path / "base", tp=2, pp=2)
    heads = write_medusa_heads(tmp_path / "heads", num_heads=2, hidden=HIDDEN, vocab=VOCAB + 1)
    write_medusa_checkpoint(base, heads, tmp_path / "medusa", max_draft_len=4)
    assert _assert_declared(tmp_path / "medusa", medusa_declared) > 0


def test_medusa_heads_exclusion_keeps_nvidias_default_exclusions(exports, tmp_path):
    """A quantized base whose quantization names no exclude_modules relies on quantize()'s default list (lm_head and the
    embeddings stay 16-bit); adding the heads' pattern must not replace that list, or the base lm_head would be
    declared FP8 and the 16-bit one written would not load."""
    from pipeline.backends.engine.medusa_checkpoint import write_medusa_checkpoint

    base = _base(exports("llama", "fp8"), tmp_path / "base", tp=1)
    config = json.loads((base / "config.json").read_text())
    del config["quantization"]["exclude_modules"]
    (base / "config.json").write_text(json.dumps(config))
    heads = write_medusa_heads(tmp_path / "heads", hidden=HIDDEN, vocab=VOCAB)
    written = write_medusa_checkpoint(base, heads, tmp_path / "medusa", max_draft_len=7)
    assert "*medusa_heads*" in written["quantization"]["exclude_modules"]
    assert _assert_declared(tmp_path / "medusa", medusa_declared) > 0


# -- EAGLE -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2])
def test_the_eagle_checkpoint_is_what_eagleforcausallm_declares(exports, tmp_path, tp):
    """Includes the EagleNets' vocab_embedding, which PretrainedModel's parallelize_embedding splits like the base's
    when the checkpoint's use_parallel_embedding is on (the converter's default)."""
    from pipeline.backends.engine.eagle_checkpoint import write_eagle_checkpoint

    base = _base(exports("llama", "none"), tmp_path / "base", tp)
    draft = write_eagle_draft(tmp_path / "eagle", hidden=HIDDEN, vocab=VOCAB, heads=4, kv_heads=2, inter=INTER, layers=2)
    config = write_eagle_checkpoint(base, draft, tmp_path / "eagle_ckpt", choices=EAGLE_TREE, max_draft_len=5)
    assert config["num_eagle_layers"] == 3
    assert _assert_declared(tmp_path / "eagle_ckpt", eagle_declared) > 0


# -- the comparison itself -------------------------------------------------------------------------------------
def test_an_extra_or_a_missing_tensor_fails_the_comparison(exports, tmp_path):
    from safetensors.torch import load_file, save_file

    from pipeline.backends.engine.medusa_checkpoint import write_medusa_checkpoint

    base = _base(exports("llama", "none"), tmp_path / "base", tp=1)
    heads = write_medusa_heads(tmp_path / "heads", hidden=HIDDEN, vocab=VOCAB)
    config = write_medusa_checkpoint(base, heads, tmp_path / "medusa", max_draft_len=7)
    tensors = load_file(str(tmp_path / "medusa" / "rank0.safetensors"))
    declared = medusa_declared(config, 0)
    assert differences(loaded_view(tensors), declared) == []
    extra = {**tensors, "transformer.layers.0.mlp.extra.weight": torch.zeros(2, 2, dtype=torch.float16)}
    assert differences(loaded_view(extra), declared) == ["extra (not declared) transformer.layers.0.mlp.extra.weight ((2, 2), 'float16')"]
    missing = {k: v for k, v in tensors.items() if k != "medusa_heads.1.lm_head.weight"}
    assert differences(loaded_view(missing), declared) == [f"missing medusa_heads.1.lm_head.weight ((250, {HIDDEN}), 'float16')"]
    wrong = {**tensors, "medusa_heads.0.medusa_layers.0.linear.bias": torch.zeros(HIDDEN, dtype=torch.float32)}
    [problem] = differences(loaded_view(wrong), declared)
    assert problem.startswith("medusa_heads.0.medusa_layers.0.linear.bias: written") and "float32" in problem
    save_file(extra, str(tmp_path / "medusa" / "rank0.safetensors"))
    with pytest.raises(AssertionError, match="rank 0 differs"):
        _assert_declared(tmp_path / "medusa", medusa_declared)

"""build.speculative.medusa.vocab_size: the cpu target's Medusa heads proposing only the first M token ids, written to
the engine directory's refengine_speculative section; refused by name when 0, beyond the heads' vocabulary, or on the
engine target (TensorRT-LLM's Medusa has no vocabulary cut); `bench speculative --medusa-vocab` refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.backends.cpu.speculative import add_speculation
from pipeline.cli import main
from tests.conftest import BUILD_CONFIGS, REPO
from tests.pipeline.backends.test_medusa import ENGINE, _load, _refused, heads  # noqa: F401 (heads: a fixture)

FIELD = "build.speculative.medusa.vocab_size"
SHIPPED_HEADS = REPO / "models" / "tiny-stdlib-llama-medusa"


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", f"{FIELD}: Input should be greater than or equal to 1"),
        ("4097", f"{FIELD} (4097) exceeds the heads' vocab_size (4096"),
    ],
)
def test_bad_vocab_sizes_are_refused_by_name(heads: Path, value: str, message: str):  # noqa: F811
    assert message in _refused(heads, f"{FIELD}={value}")


def test_the_engine_target_refuses_a_vocabulary_cut(heads: Path):  # noqa: F811
    message = _refused(heads, *ENGINE, f"{FIELD}=1024")
    assert f"{FIELD} is refused on build.target engine: TensorRT-LLM 1.2's Medusa has no vocabulary cut" in message


def test_the_cpu_build_records_the_cut(heads: Path, tmp_path: Path):  # noqa: F811
    speculative = _load(heads, f"{FIELD}=1024").spec.build.speculative
    assert speculative.medusa.vocab_size == 1024
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    (engine_dir / "config.json").write_text(json.dumps({"build_config": {}}))
    add_speculation(engine_dir, speculative, None, max_seq_len=1024)
    assert json.loads((engine_dir / "config.json").read_text())["refengine_speculative"]["medusa_vocab_size"] == 1024
    uncut = _load(heads).spec.build.speculative
    add_speculation(engine_dir, uncut, None, max_seq_len=1024)
    assert "medusa_vocab_size" not in json.loads((engine_dir / "config.json").read_text())["refengine_speculative"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--medusa-vocab", "512"], "--medusa-vocab 512: needs --medusa"),
        (["--medusa", str(SHIPPED_HEADS), "--medusa-vocab", "0"], "--medusa-vocab 0: needs --medusa and a positive number"),
    ],
)
def test_bench_medusa_vocab_is_refused_before_anything_is_built(extra, message, capsys, tmp_path: Path):
    argv = ["--artifacts", str(tmp_path), "bench", "speculative", str(BUILD_CONFIGS / "tiny-cpu.yaml"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())

"""build.speculative.medusa.vocab_size: the cpu target's Medusa heads proposing only the first M token ids, written to
the engine directory's refengine_speculative section; refused by name when 0, beyond the heads' vocabulary, or on the
engine target (TensorRT-LLM's Medusa has no vocabulary cut)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.backends.cpu_speculative import add_speculation
from tests.unit.test_medusa import ENGINE, _load, _refused, heads  # noqa: F401 (heads: a fixture)

FIELD = "build.speculative.medusa.vocab_size"


@pytest.mark.parametrize("value, message", [
    ("0", f"{FIELD}: Input should be greater than or equal to 1"),
    ("4097", f"{FIELD} (4097) exceeds the heads' vocab_size (4096"),
])
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

"""Configs and model directories that are broken or hostile: each refused at `validate` with exit 2 and
a message naming the file, the line or key, and the limit, before anything is written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import MINIMAL_CONFIG, write_model_config

BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi")
)


def _config(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        (BOMB, "more than 100000 values once YAML aliases are expanded"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "cfg.yaml:1: nested deeper than 32 levels"),
        (b"name: demo\n# caf\xe9\nmodel:\n  source: model\n", "cfg.yaml:2: byte 0xe9 is not UTF-8"),
        ("# padding\n" * 120_000, "a build config may have at most 1048576 bytes"),
    ],
    ids=["alias-bomb", "deep", "latin-1", "huge"],
)
def test_hostile_yaml_is_refused_at_once(tmp_path, capsys, text, message):
    started = time.monotonic()
    assert main(["--artifacts", str(tmp_path / "artifacts"), "validate", str(_config(tmp_path, text))]) == 2
    # a hang guard, generous for a loaded machine: the message below shows the limit refused it; expanding the bomb's
    # 9**9 values would take far longer (and gigabytes)
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_hidden_layers=0), "num_hidden_layers 0 is out of range (1..1024)"),
        (dict(num_attention_heads=0), "num_attention_heads 0 is out of range"),
        (dict(hidden_size=-256), "hidden_size -256 is out of range"),
        (dict(vocab_size=10**12), "vocab_size 1000000000000 is out of range"),
        (dict(hidden_size=250), "hidden_size 250 is not a multiple of num_attention_heads 4"),
        (dict(num_key_value_heads=3), "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        (dict(num_hidden_layers="4"), "num_hidden_layers must be an integer, got '4'"),
        (dict(num_attention_heads=None), "num_attention_heads is missing"),
    ],
)
def test_model_config_fields_are_checked_by_name(tmp_path, overrides, message):
    model = write_model_config(tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    for key, value in overrides.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError) as raised:
        load_config(_config(tmp_path, MINIMAL_CONFIG))
    assert message in raised.value.message and "config.json" in raised.value.message


@pytest.mark.parametrize("name, content", [("tokenizer.json", "{not json"), ("tokenizer.json", '{"version": "1.0"}'), ("tokenizer_config.json", "[]")])
def test_a_garbage_tokenizer_file_is_refused_at_validate(tmp_path, name, content):
    model = write_model_config(tmp_path / "model")
    (model / name).write_text(content)
    with pytest.raises(SpecError, match=name):
        load_config(_config(tmp_path, MINIMAL_CONFIG))

"""serve.traffic at `validate`: a working table loads, and each bad input of issue 42 is refused with a SpecError naming
the field (through load_config, as `trtllm-pipeline validate` reads a file)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import BUILD_CONFIGS

TINY = BUILD_CONFIGS / "tiny-cpu.yaml"
CLASSES = """
serve:
  traffic:
    default_class: batch
    classes:
      - {name: interactive, priority: 1.0, ttft_slo_ms: 500, tpot_slo_ms: 50, max_queue: 64, service_tiers: [priority]}
      - {name: batch, priority: 0.0, min_share: 0.1, shed: false, service_tiers: [flex, default]}
    keys:
      chat-app: {default: interactive}
      nightly: {default: batch, allowed: [batch]}
"""


def _config(tmp_path: Path, traffic_yaml: str, change=None) -> Path:
    """tiny-cpu.yaml with the serve section of `traffic_yaml` merged into its own, its table changed by `change`."""
    document = yaml.safe_load(TINY.read_text())
    document["model"]["source"] = str((TINY.parent / document["model"]["source"]).resolve())  # relative to the file
    document["serve"].update(yaml.safe_load(textwrap.dedent(traffic_yaml))["serve"])
    if change is not None:
        change(document["serve"]["traffic"])
    path = tmp_path / "tiny-classes.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def refused(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path, ())
    return info.value.message


def test_a_table_loads_with_every_field(tmp_path):
    traffic = load_config(_config(tmp_path, CLASSES), ()).spec.serve.traffic
    assert traffic is not None
    assert [c.name for c in traffic.classes] == ["interactive", "batch"]
    assert traffic.classes[0].priority == 1.0 and traffic.classes[0].ttft_slo_ms == 500
    assert traffic.classes[1].shed is False and traffic.classes[1].min_share == 0.1
    assert traffic.keys["nightly"].allowed == ("batch",)


def test_without_a_table_there_is_one_class():
    assert load_config(TINY, ()).spec.serve.traffic is None


def _set(path: str, value):
    """A change to the table: `path` is dotted, with list indexes as numbers (--set takes no indexes)."""

    def change(traffic: dict) -> None:
        *parents, last = path.split(".")
        node = traffic
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("classes.1.name", "interactive", "the name 'interactive' is given more than once"),
        ("classes.0.ttft_slo_ms", 0, "serve.traffic.classes.0.ttft_slo_ms"),
        ("classes.0.tpot_slo_ms", -5, "serve.traffic.classes.0.tpot_slo_ms"),
        ("classes.0.priority", 1.5, "serve.traffic.classes.0.priority"),
        ("classes.0.priority", "high", "serve.traffic.classes.0.priority"),
        ("classes.0.min_share", 0.95, "the min_share values sum to 1.05, above 1"),
        ("classes.0.max_queue", 0, "serve.traffic.classes.0.max_queue"),
        ("classes.0.name", "Interactive", "serve.traffic.classes.0.name"),
        ("default_class", "bulk", "serve.traffic.default_class 'bulk' is not a class (the classes: interactive, batch)"),
        ("keys.chat-app.default", "premium", "serve.traffic.keys.chat-app: 'premium' is not a class"),
        ("keys.nightly.default", "interactive", "serve.traffic.keys.nightly.default 'interactive' is not among its allowed classes"),
        ("classes.1.service_tiers", ["priority"], "'priority' already selects class 'interactive'"),
        ("classes.1.service_tiers", ["interactive"], "'interactive' already selects class 'interactive'"),
    ],
    ids=lambda value: str(value),
)
def test_bad_input_is_refused_naming_the_field(tmp_path, path, value, expected):
    assert expected in refused(_config(tmp_path, CLASSES, _set(path, value)))


def test_a_key_name_that_cannot_be_an_api_key_name_is_refused(tmp_path):
    bad = CLASSES.replace("nightly:", "'9nightly':")
    assert "serve.traffic.keys.9nightly: not an API key name" in refused(_config(tmp_path, bad))


def test_an_empty_class_list_is_refused(tmp_path):
    empty = "\nserve:\n  traffic:\n    default_class: batch\n    classes: []\n"
    assert "serve.traffic.classes" in refused(_config(tmp_path, empty))

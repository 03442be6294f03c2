"""The spec's field descriptions and section docstrings describe the field, not its history: they land in
build_configs/schema.json and docs/reference.md, where an issue number or a "now" / "formerly" tells a user nothing
about what the field does. History belongs in the commit log, BENCHMARKS.md and the docs pages."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.config.schema import spec_schema_text

# An issue or pull-request reference (#34, core #466) and words that tell a field's history instead of its behaviour.
HISTORY = re.compile(
    r"#\d+|\bissue\b|\bnow\b|\bformerly\b|\bused to\b|\bsessions?\b|\bpreviously\b|\bno longer\b|\banymore\b"
    r"|\bafter the fix\b|\bas before\b",
    re.IGNORECASE,
)


def schema_descriptions() -> dict[str, str]:
    """Every description of the generated schema (fields and section docstrings), by its JSON path."""
    found: dict[str, str] = {}

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "description" and isinstance(value, str):
                    found[path or "/"] = value
                else:
                    walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(json.loads(spec_schema_text()), "")
    return found


def test_the_schema_has_field_descriptions_to_check() -> None:
    descriptions = schema_descriptions()
    assert "/$defs/ServeSpec/properties/postprocessing_dynamic_batching" in descriptions
    assert len(descriptions) > 100


def test_no_description_tells_history() -> None:
    offending = {path: HISTORY.findall(text) for path, text in schema_descriptions().items() if HISTORY.search(text)}
    assert offending == {}, "describe what the field does, not its history (issue numbers, 'now', 'formerly', ...)"


@pytest.mark.parametrize(
    "text",
    ["Faster (#34).", "It now streams.", "Formerly 4.", "What it used to do.", "Measured in session 12.", "No longer needed."],
)
def test_the_pattern_catches_history(text: str) -> None:
    assert HISTORY.search(text)


@pytest.mark.parametrize(
    "text",
    ["Tokens per block: a power of two in 16..128.", "Known-good default; see BENCHMARKS.md.", "Snowfall"],
)
def test_the_pattern_passes_plain_descriptions(text: str) -> None:
    assert not HISTORY.search(text)

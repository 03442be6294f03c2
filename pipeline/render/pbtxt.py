"""Render `config.pbtxt` templates strictly, and prove the result is a valid Triton ModelConfig.

Jinja2 with StrictUndefined: a missing value fails the render instead of leaving a hole. Every
rendered file is then linted (no `{{`, `{%`, `${`, `None`, or empty string parameter left) and
parsed with Triton's own protobuf schema (`tritonclient.grpc.model_config_pb2`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.errors import StageError

_LEFTOVERS = (
    ("{{", "an unrendered Jinja expression"),
    ("{%", "an unrendered Jinja statement"),
    ("${", "an unfilled ${...} placeholder"),
)
_NONE_VALUE = re.compile(r"(:\s*|\[\s*|,\s*)None\b")
_EMPTY_STRING_VALUE = re.compile(r'string_value:\s*""')


def pbtxt_string(value: Any) -> str:
    """A protobuf text-format string literal."""
    if value is None:
        raise StageError("a config.pbtxt string value is None; every rendered value must be set")
    text = str(value)
    if any(ord(char) < 0x20 for char in text):
        raise StageError(f"config.pbtxt string {text!r} contains a control character")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def template_environment(templates_dir: Path) -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    environment.filters["pbtxt_string"] = pbtxt_string
    return environment


def render_config(environment: jinja2.Environment, template: str, context: dict[str, Any]) -> str:
    try:
        text = environment.get_template(template).render(**context)
    except jinja2.UndefinedError as error:
        raise StageError(f"template {template}: {error.message}") from error
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return text


def lint_config(text: str, where: str) -> None:
    for marker, what in _LEFTOVERS:
        if marker in text:
            raise StageError(f"{where}: {what} ({marker!r}) is left in the rendered config")
    if _NONE_VALUE.search(text):
        raise StageError(f"{where}: a Python None was rendered into the config")
    if _EMPTY_STRING_VALUE.search(text):
        raise StageError(f"{where}: an empty string parameter was rendered into the config")


def parse_config(text: str, where: str) -> model_config_pb2.ModelConfig:
    """Parse with Triton's ModelConfig schema; StageError with the parser's message if invalid."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise StageError(f"{where}: not a valid Triton model config: {error}") from error
    return config

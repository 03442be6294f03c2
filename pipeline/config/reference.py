"""The build-config field reference (docs/reference.md), generated from the Spec's field descriptions."""

from __future__ import annotations

from enum import Enum
from typing import Any, get_args

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipeline.config.spec import Spec
from pipeline.config.spec.strict import section_model

BEGIN = "<!-- BEGIN GENERATED CONFIG REFERENCE (trtllm-pipeline schema --markdown) -->"
END = "<!-- END GENERATED CONFIG REFERENCE -->"


def config_reference_markdown() -> str:
    rows: list[str] = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    _rows(Spec, "", rows)
    return "\n".join([BEGIN, *rows, END]) + "\n"


def _rows(model: type[BaseModel], prefix: str, rows: list[str]) -> None:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        dotted = f"{prefix}{name}"
        section = section_model(annotation)
        if section is not None:
            optional = "optional section (default: absent)" if section is not annotation else "section"
            rows.append(f"| **`{dotted}`** | {optional} | | {_text(field.description)} |")
            _rows(section, f"{dotted}.", rows)
            continue
        rows.append(f"| `{dotted}` | {_type_name(annotation)} | {_default(field)} | {_text(field.description)} |")


def _text(description: str | None) -> str:
    """A description as Markdown text: `<artifacts>/<name>/` would otherwise be read as HTML tags and vanish."""
    return (description or "").replace("<", "&lt;")


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    args = [a for a in get_args(annotation) if a is not type(None)]
    if args and len(args) < len(get_args(annotation)):
        return f"{_type_name(args[0])} or null"
    if getattr(annotation, "__origin__", None) is tuple:
        return f"list of {_type_name(get_args(annotation)[0])}"
    return getattr(annotation, "__name__", str(annotation)).lower()


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if value is PydanticUndefined:
        return ""
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == ():
        return "`[]`"
    return f"`{value}`"

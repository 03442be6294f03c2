"""Load a build config: YAML (+ `--set` overrides) → validated, frozen Spec, or one SpecError naming file:line and field."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.config.model_checks import Issue, inspect_model
from pipeline.config.model_info import ModelInfo
from pipeline.config.overrides import apply_overrides, parse_override
from pipeline.config.spec import Spec
from pipeline.config.spec.strict import section_model
from pipeline.config.yaml_source import Location, SourceMap, decode_config, read_yaml
from pipeline.errors import SpecError

_DOTTED = re.compile(r"\b([a-z_]+(?:\.[a-z_]+)+)\b")
_LEADING_DOTTED = re.compile(r"([a-z_]+(?:\.[a-z_]+)+)\b")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated spec plus where it came from."""

    spec: Spec
    path: Path
    model: ModelInfo
    source_map: SourceMap

    @property
    def base_dir(self) -> Path:
        return self.path.parent


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedConfig:
    path = Path(path)
    origin = str(path)
    if not path.is_file():
        raise SpecError(f"{origin}: config file not found", hint="pass the path of a YAML file, e.g. build_configs/tiny-cpu.yaml")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SpecError(f"{origin}: cannot read it ({error.strerror or error})") from None
    data, source_map = read_yaml(decode_config(raw, origin), origin)
    parsed = [parse_override(text) for text in overrides]
    for text, (key_path, _) in zip(overrides, parsed):
        source_map.locations[key_path] = Location(f"--set {text}")
    if not isinstance(data, dict):
        raise SpecError(f"{origin}:1: the top level must be a mapping of sections (name, model, build, ...)")
    data = apply_overrides(data, parsed)
    _resolve_paths(data, path.parent.resolve())
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_validation_errors(exc, source_map)) from None
    model, issues = inspect_model(spec)
    if issues or model is None:  # inspect_model returns issues whenever it has no model
        raise SpecError(format_issues(issues, source_map))
    return LoadedConfig(spec=spec, path=path, model=model, source_map=source_map)


def _resolve_paths(data: dict[str, Any], base_dir: Path) -> None:
    """Make the spec's paths and globs absolute, relative to the YAML file's directory."""

    def absolute(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (base_dir / path).resolve())

    model = _section(data, "model")
    if "source" in model:
        model["source"] = absolute(model["source"])
    speculative = _section(_section(data, "build"), "speculative")
    draft = _section(speculative, "draft")
    if "source" in draft:
        draft["source"] = absolute(draft["source"])
    for heads in (_section(speculative, "medusa"), _section(speculative, "eagle")):
        if "heads" in heads:
            heads["heads"] = absolute(heads["heads"])
    calibration = _section(_section(data, "quantize"), "calibration")
    accuracy = _section(_section(data, "gate"), "accuracy")
    if "baseline" in accuracy:
        accuracy["baseline"] = absolute(accuracy["baseline"])
    lora = _section(_section(data, "build"), "lora")
    serve_lora = _section(_section(data, "serve"), "lora")
    if "prefetch_dir" in serve_lora:
        serve_lora["prefetch_dir"] = absolute(serve_lora["prefetch_dir"])
    for section, key in ((calibration, "files"), (accuracy, "heldout_files"), (lora, "adapter_dirs")):
        if isinstance(section.get(key), list):
            section[key] = [absolute(item) for item in section[key]]


def _section(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def format_issues(issues: list[Issue], source_map: SourceMap) -> str:
    lines = [f"{source_map.locate(path)}: {_naming_the_field_once(_dotted(path), message)}" for path, message in issues]
    return _join(lines)


def _naming_the_field_once(dotted: str, message: str) -> str:
    """A message that starts with the field it is about stands alone (the spec's validators and the checks
    write them so); any other message (pydantic's own, or one that cannot know its path) gets the field first."""
    leading = _LEADING_DOTTED.match(message)
    if leading is not None and _is_field(leading.group(1)):
        return message
    return f"{dotted}: {message}"


def _is_field(dotted: str) -> bool:
    *sections, name = dotted.split(".")
    model = _model_at(tuple(sections))
    return model is not None and name in model.model_fields


def _join(lines: list[str]) -> str:
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} problems in the build config:\n" + "\n".join(f"  {line}" for line in lines)


def _format_validation_errors(exc: ValidationError, source_map: SourceMap) -> str:
    lines: list[tuple[str, str]] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        dotted = _dotted(loc)
        kind = error["type"]
        message = error["msg"]
        if kind == "extra_forbidden":
            where = source_map.locate(loc)
            text = f"{where}: {dotted}: unknown key {loc[-1]!r}{_did_you_mean(loc)}"
        elif kind == "missing":
            where = source_map.locate(loc[:-1]) if loc[:-1] else Location(source_map.origin, 1)
            text = f"{where}: {dotted}: required field is missing"
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
            where = _locate_by_message(message, loc, source_map)
            text = f"{where}: {_naming_the_field_once(dotted, message)}"
        else:
            where = source_map.locate(loc)
            text = f"{where}: {dotted}: {message}, got {error.get('input')!r}"
        lines.append((str(where), text))
    return _join([text for _, text in lines])


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _locate_by_message(message: str, loc: tuple[Any, ...], source_map: SourceMap) -> Location:
    """A cross-field error names fields in its message; point at the first one the file sets."""
    for match in _DOTTED.finditer(message):
        found = source_map.locations.get(tuple(match.group(1).split(".")))
        if found is not None:
            return found
    return source_map.locate(loc)


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (valid keys: {', '.join(names)})"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Spec
    for part in loc:
        field = model.model_fields.get(str(part))
        section = section_model(field.annotation) if field is not None else None
        if section is None:
            return None
        model = section
    return model

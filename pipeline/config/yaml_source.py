"""Read a YAML file into plain data, remembering the line of every key and refusing duplicate keys.

A build config is a few kilobytes of nested sections, so what is not one is refused before it can
cost anything (exit 2, naming the file, the line and the limit): a file over MAX_CONFIG_BYTES, bytes
that are not UTF-8, nesting deeper than MAX_DEPTH (checked on PyYAML's event stream, which is not
recursive, before the recursive composer sees it), and more than MAX_VALUES values once aliases are
expanded (a "billion laughs" alias bomb of a few hundred bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from pipeline.errors import SpecError

Path_ = tuple[str | int | float, ...]  # the keys as YAML read them: a key may be any plain scalar

MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_VALUES = 100_000


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file and line, or a `--set` override."""

    source: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source


@dataclass
class SourceMap:
    """Dotted path → location of the key that set it."""

    origin: str
    locations: dict[Path_, Location] = field(default_factory=dict)

    def locate(self, path: Path_) -> Location:
        """The location of `path`, or of its nearest ancestor that has one."""
        for end in range(len(path), 0, -1):
            found = self.locations.get(tuple(path[:end]))
            if found is not None:
                return found
        return Location(self.origin, 1)


def decode_config(raw: bytes, origin: str) -> str:
    """A config file's bytes as text, or SpecError naming the size limit or the line of a non-UTF-8 byte."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise SpecError(f"{origin}: {len(raw)} bytes; a build config may have at most {MAX_CONFIG_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise SpecError(f"{origin}:{line}: byte 0x{raw[error.start]:02x} is not UTF-8 (build configs are UTF-8 text)") from None


def read_yaml(text: str, origin: str) -> tuple[Any, SourceMap]:
    """Parse `text`; return the data and a map of every key's line. `origin` names the file in errors."""
    _check_depth(text, origin)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    source_map = SourceMap(origin)
    if root is None:
        return {}, source_map
    return _construct(loader, root, (), source_map, origin, [0]), source_map


def _check_depth(text: str, origin: str) -> None:
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1
                    raise SpecError(f"{origin}:{line}: nested deeper than {MAX_DEPTH} levels; a build config needs a handful")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # composing reports it, with its line


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: Path_, source_map: SourceMap, origin: str, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_VALUES:
        line = node.start_mark.line + 1
        raise SpecError(f"{origin}:{line}: more than {MAX_VALUES} values once YAML aliases are expanded; refusing an alias bomb")
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)):
                raise SpecError(f"{origin}:{line}: keys must be plain scalars")
            if key in result:
                first = source_map.locations[path + (key,)].line
                dotted = ".".join(str(p) for p in path + (key,))
                raise SpecError(f"{origin}:{line}: duplicate key {dotted!r} (first set on line {first})")
            source_map.locations[path + (key,)] = Location(origin, line)
            result[key] = _construct(loader, value_node, path + (key,), source_map, origin, count)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            source_map.locations[path + (index,)] = Location(origin, item.start_mark.line + 1)
            items.append(_construct(loader, item, path + (index,), source_map, origin, count))
        return items
    return loader.construct_object(node, deep=True)

"""Traffic classes in the front end: which class a request is in, from its API key and the fields it sends.

The table is the spec's serve.traffic, rendered as the preprocessing model's `traffic_classes` parameter (JSON), read
with the model's other facts (model.py). Mapping and polarity, decided once (docs/traffic-classes.md):

- no field: the key's default class (serve.traffic.keys.NAME.default), else the table's default_class;
- OpenAI's `service_tier`: a class name, or a value a class lists in its service_tiers; `auto` and `default` that no
  class lists mean "no field";
- vLLM's `priority` (an integer, lower runs first): the class's rank when the classes are ordered by priority, highest
  first: 0 is the highest class, 1 the next, …;
- the class's own priority, a number in [0, 1] with the higher first (TensorRT-LLM's), is what the engine receives.

Given both fields, they must name the same class. A key limited to some classes (serve.traffic.keys.NAME.allowed) gets
403 for another, naming the class and never the key. Without a table, `service_tier` auto/default and `priority` 0 are
accepted (they ask for nothing) and anything else is refused: this server has one class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.openai_server.errors import OpenAIError, bad_request

PASS_THROUGH_TIERS = ("auto", "default")  # OpenAI's "use the project's default"


class TrafficTableError(ValueError):
    """The rendered table cannot be read (a hand-edited repository): the front end refuses to start."""


@dataclass(frozen=True)
class TrafficClass:
    name: str
    priority: float  # [0, 1], higher first
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    max_queue: int | None = None
    min_share: float = 0.0
    shed: bool = True
    service_tiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeyClasses:
    default: str
    allowed: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TrafficTable:
    classes: tuple[TrafficClass, ...]
    default_class: str
    keys: Mapping[str, KeyClasses] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str, source: str) -> TrafficTable:
        try:
            document = json.loads(text)
            table = cls(
                classes=tuple(_traffic_class(item) for item in document["classes"]),
                default_class=str(document["default_class"]),
                keys={str(name): KeyClasses(str(key["default"]), _names(key.get("allowed"))) for name, key in document.get("keys", {}).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise TrafficTableError(f"{source}: the traffic_classes parameter is not a traffic-class table ({error})") from None
        names = table.names
        for name in (table.default_class, *(c for key in table.keys.values() for c in (key.default, *(key.allowed or ())))):
            if name not in names:
                raise TrafficTableError(f"{source}: the traffic_classes parameter names class {name!r}, which it does not define")
        return table

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(traffic_class.name for traffic_class in self.classes)

    @property
    def ranked(self) -> tuple[TrafficClass, ...]:
        """Highest priority first (vLLM's `priority` is the index here); equal priorities keep the table's order."""
        return tuple(sorted(self.classes, key=lambda traffic_class: -traffic_class.priority))

    def by_name(self, name: str) -> TrafficClass:
        return next(traffic_class for traffic_class in self.classes if traffic_class.name == name)

    def check_key_names(self, key_names: Sequence[str]) -> None:
        """Every key the table maps must be one the server has: a misspelt name would put its key in the default class."""
        unknown = sorted(set(self.keys) - set(key_names))
        if unknown and not key_names:
            raise TrafficTableError(
                f"serve.traffic.keys maps API key names ({', '.join(repr(name) for name in unknown)}), but this server has no "
                "API keys: give them with --api-key-file or TRTLLM_PIPELINE_API_KEYS (docs/api-keys.md)"
            )
        if unknown:
            raise TrafficTableError(
                f"serve.traffic.keys names {', '.join(repr(name) for name in unknown)}, which no API key of this server has "
                "(the NAME of NAME:KEY in the key file)"
            )

    def resolve(self, key_name: str | None, service_tier: Any, priority: Any) -> TrafficClass:
        """The class of a request from `key_name` (None: no keys) with these fields (None: not sent); OpenAIError 400/403."""
        key = self.keys.get(key_name) if key_name is not None else None
        asked = [name for name in (self._by_tier(service_tier), self._by_rank(priority)) if name is not None]
        if len(set(asked)) > 1:
            raise bad_request(
                f"service_tier selects class {asked[0]!r} and priority selects {asked[1]!r}: send one, or both for the same class", param="priority"
            )
        chosen = asked[0] if asked else (key.default if key is not None else self.default_class)
        if asked and key is not None and key.allowed is not None and chosen not in key.allowed:
            raise OpenAIError(
                403,
                f"This API key may not use traffic class {chosen!r}; it may use: {', '.join(key.allowed)}.",
                param="service_tier" if service_tier is not None else "priority",
                code="class_not_allowed",
            )
        return self.by_name(chosen)

    def _by_tier(self, service_tier: Any) -> str | None:
        if service_tier is None:
            return None
        if not isinstance(service_tier, str):
            raise bad_request(f"service_tier must be a string, got {type(service_tier).__name__}", param="service_tier")
        for traffic_class in self.classes:
            if service_tier == traffic_class.name or service_tier in traffic_class.service_tiers:
                return traffic_class.name
        if service_tier in PASS_THROUGH_TIERS:
            return None
        tiers = sorted({tier for traffic_class in self.classes for tier in traffic_class.service_tiers})
        also = f"; or a service tier: {', '.join(tiers)}" if tiers else ""
        raise bad_request(f"Unknown service_tier {service_tier!r}. The traffic classes: {', '.join(self.names)}{also}.", param="service_tier")

    def _by_rank(self, priority: Any) -> str | None:
        if priority is None:
            return None
        ranked = self.ranked
        rank = _rank(priority, len(ranked))
        return ranked[rank].name


def resolve_without_table(service_tier: Any, priority: Any) -> None:
    """A server with one class: what asks for nothing passes, anything else is refused by name."""
    if service_tier is not None and service_tier not in PASS_THROUGH_TIERS:
        raise bad_request(
            f"Unknown service_tier {service_tier!r}: this server has no traffic classes (serve.traffic), only {' and '.join(PASS_THROUGH_TIERS)}",
            param="service_tier",
        )
    if priority is not None and _rank(priority, None) != 0:
        raise bad_request(f"priority {priority} asks for a class, but this server has no traffic classes (serve.traffic): only 0", param="priority")


def _rank(priority: Any, count: int | None) -> int:
    """vLLM's integer priority, checked against `count` classes (None: the type only)."""
    if isinstance(priority, float) and priority.is_integer():
        priority = int(priority)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise bad_request(f"priority must be an integer (vLLM's: 0 is the highest class), got {type(priority).__name__}", param="priority")
    if count is not None and not 0 <= priority < count:
        raise bad_request(f"priority {priority} is out of range: 0 (the highest class) to {count - 1}", param="priority")
    return priority


def _traffic_class(item: Mapping[str, Any]) -> TrafficClass:
    priority = float(item["priority"])
    if not 0.0 <= priority <= 1.0:
        raise ValueError(f"class {item['name']!r}: priority {priority} is not in [0, 1]")
    return TrafficClass(
        name=str(item["name"]),
        priority=priority,
        ttft_slo_ms=_optional_float(item.get("ttft_slo_ms")),
        tpot_slo_ms=_optional_float(item.get("tpot_slo_ms")),
        max_queue=int(item["max_queue"]) if item.get("max_queue") is not None else None,
        min_share=float(item.get("min_share", 0.0)),
        shed=bool(item.get("shed", True)),
        service_tiers=_names(item.get("service_tiers")) or (),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"expected a list of names, got {value!r}")
    return tuple(value)

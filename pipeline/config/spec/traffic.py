"""The spec's serve.traffic section: traffic classes (priority, SLOs, queue bound, share) and which API key is in which.

Polarity, decided once for the whole project: a class's `priority` is a number in [0, 1] and the HIGHER one runs
first, as TensorRT-LLM's (the executor's `Request` priority, default 0.5: NVIDIA/TensorRT-LLM
cpp/include/tensorrt_llm/executor/executor.h; 1.3's `generate_async(priority=)`). The OpenAI front end maps the
request fields onto classes (clients/openai_server/traffic.py): OpenAI's `service_tier` names a class or one of its
`service_tiers`; vLLM's integer `priority` (lower first) is the class's rank, 0 being the highest class.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from clients.api_keys import KEY_NAME
from pipeline.config.spec.strict import StrictModel

CLASS_NAME = r"^[a-z][a-z0-9_-]{0,31}$"


class TrafficClass(StrictModel):
    name: str = Field(pattern=CLASS_NAME, description="The class's name: what `service_tier` and the metrics call it.")
    priority: float = Field(
        ge=0.0,
        le=1.0,
        description="Relative priority in [0, 1], higher first (TensorRT-LLM's polarity): its requests wait ahead of "
        "those of lower classes, and may preempt them in the cpu engine.",
    )
    ttft_slo_ms: float | None = Field(default=None, gt=0.0, le=3_600_000, description="Time-to-first-token objective in milliseconds (unset: none).")
    tpot_slo_ms: float | None = Field(
        default=None, gt=0.0, le=3_600_000, description="Time-per-output-token (inter-token) objective in milliseconds (unset: none)."
    )
    max_queue: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Most requests of this class waiting in front of the engine; one more is answered 429 at once (unset: no bound of its own).",
    )
    min_share: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="The share of the engine's request slots this class is guaranteed while it has requests waiting, so a low "
        "class is never starved; the shares of all classes sum to at most 1.",
    )
    shed: bool = Field(
        default=True,
        description="Refuse a request (429 with Retry-After) when its TTFT objective cannot be met given the queue in front of "
        "it; false: serve it late instead.",
    )
    service_tiers: tuple[str, ...] = Field(
        default=(),
        description="OpenAI `service_tier` values that select this class besides its name (e.g. priority, flex, default).",
    )


class KeyClasses(StrictModel):
    """The classes of one API key (by its NAME in NAME:KEY; never the key)."""

    default: str = Field(description="The class of this key's requests that ask for none.")
    allowed: tuple[str, ...] | None = Field(
        default=None,
        description="The classes this key may ask for (with service_tier or priority); unset: every class. A request for another is answered 403.",
    )


class TrafficSpec(StrictModel):
    classes: tuple[TrafficClass, ...] = Field(min_length=1, max_length=16, description="The traffic classes.")
    default_class: str = Field(description="The class of a request that names none and whose key has no default of its own.")
    keys: dict[str, KeyClasses] = Field(
        default_factory=dict,
        description="Per API key name (NAME of NAME:KEY in the key file): its default class and the classes it may use.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrafficSpec:
        names = [traffic_class.name for traffic_class in self.classes]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"serve.traffic.classes: the name {duplicates[0]!r} is given more than once; class names are unique")
        share = sum(traffic_class.min_share for traffic_class in self.classes)
        if share > 1.0 + 1e-9:
            raise ValueError(f"serve.traffic.classes: the min_share values sum to {share:g}, above 1")
        known = ", ".join(names)
        if self.default_class not in names:
            raise ValueError(f"serve.traffic.default_class {self.default_class!r} is not a class (the classes: {known})")
        tiers: dict[str, str] = {}
        for index, traffic_class in enumerate(self.classes):
            for tier in traffic_class.service_tiers:
                owner = tier if tier in names else tiers.get(tier)
                if owner is not None and owner != traffic_class.name:
                    raise ValueError(
                        f"serve.traffic.classes[{index}].service_tiers: {tier!r} already selects class {owner!r}; a service_tier value selects one class"
                    )
                tiers[tier] = traffic_class.name
        for key_name, key in self.keys.items():
            where = f"serve.traffic.keys.{key_name}"
            if not KEY_NAME.fullmatch(key_name):
                raise ValueError(f"{where}: not an API key name (a letter, then letters, digits, _ . -; at most 64)")
            for class_name in (key.default, *(key.allowed or ())):
                if class_name not in names:
                    raise ValueError(f"{where}: {class_name!r} is not a class (the classes: {known})")
            if key.allowed is not None and key.default not in key.allowed:
                raise ValueError(f"{where}.default {key.default!r} is not among its allowed classes {list(key.allowed)}")
        return self

"""What resolving a build request against trtllm-build's rules carries: the request as it stands, the decisions
(a value changed with its reason, a warning, a note) and the errors, with the YAML field behind each attribute.
The rules themselves: build_rules.py (plugins, sizes, the GPU) and adapter_rules.py (LoRA, speculative decoding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.backends.engine.build_request import BuildRequest
from pipeline.quant_formats import KVCacheFormat, WeightFormat, kv_cache_format, sm_version, weight_format

_PLUGIN_ATTRS = frozenset(
    {
        "gpt_attention_plugin",
        "gemm_plugin",
        "context_fmha",
        "use_paged_context_fmha",
        "use_fp8_context_fmha",
        "use_fused_mlp",
        "remove_input_padding",
        "reduce_fusion",
        "multiple_profiles",
    }
)
_FIELD_NAMES = {
    "quant_algo": "quantize.algo",
    "kv_cache_quant": "quantize.kv_cache",
    "enable_kv_cache_reuse": "serve.enable_kv_cache_reuse",
    "enable_chunked_context": "serve.enable_chunked_context",
    "lora_plugin": "build.lora",
    "lora_dirs": "build.lora.adapter_dirs",
    "lora_target_modules": "build.lora.target_modules",
    "max_lora_rank": "build.lora.max_rank",
    "lora_ckpt_source": "build.lora.adapter_source",
    "speculative_decoding_mode": "build.speculative.mode",
    "max_draft_len": "build.speculative.max_draft_len",
}


def field_name(attr: str) -> str:
    """The dotted YAML field behind a BuildRequest attribute."""
    if attr in _PLUGIN_ATTRS:
        return f"build.plugins.{attr}"
    return _FIELD_NAMES.get(attr, f"build.{attr}")


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


@dataclass(frozen=True)
class Decision:
    """What the pipeline did with one value that trtllm-build would otherwise change silently."""

    field: str  # dotted YAML field (or build setting) concerned
    requested: Any
    applied: Any
    reason: str
    kind: Literal["changed", "warning", "note"] = "changed"

    def __str__(self) -> str:
        if self.kind == "changed":
            return f"changed {self.field} {show_value(self.requested)} -> {show_value(self.applied)}: {self.reason}"
        return f"{self.kind} {self.field} = {show_value(self.applied)}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Resolution:
    def __init__(self, request: BuildRequest, sm: int | None) -> None:
        self.cur = request
        self.sm = sm
        self.decisions: list[Decision] = []
        self.errors: list[str] = []

    def change(self, attr: str, value: Any, reason: str, kind: Literal["changed", "note"] = "changed") -> None:
        old = getattr(self.cur, attr)
        if old != value:
            self.decisions.append(Decision(field_name(attr), old, value, reason, kind))
            self.cur = dataclasses.replace(self.cur, **{attr: value})

    def warn(self, attr_or_field: str, reason: str, kind: Literal["warning", "note"] = "warning", value: Any = None) -> None:
        """A warning or note about an attribute of the request (its value is shown) or another named setting."""
        if hasattr(self.cur, attr_or_field):
            name, value = field_name(attr_or_field), getattr(self.cur, attr_or_field)
        else:
            name = attr_or_field
        self.decisions.append(Decision(name, value, value, reason, kind))

    def error(self, message: str) -> None:
        self.errors.append(message)

    @property
    def max_seq_len(self) -> int:
        """build.max_seq_len, for the rules after build_rules' sequence-length rule (the first), which settles it."""
        if self.cur.max_seq_len is None:
            raise RuntimeError("a build rule read max_seq_len before the sequence-length rule settled it")
        return self.cur.max_seq_len

    @property
    def sm_text(self) -> str:
        return f"SM {sm_version(self.sm)}" if self.sm is not None else "no GPU declared"

    @property
    def weights(self) -> WeightFormat:
        return weight_format(self.cur.quant_algo)

    @property
    def kv(self) -> KVCacheFormat:
        return kv_cache_format(self.cur.kv_cache_quant)

"""`GuidedDecodingParams`: the guide of one request, as TensorRT-LLM names it.

Guide types are TensorRT-LLM's `GuidedDecodingParams.GuideType` names as the Triton input
`guided_decoding_guide_type` carries them: `json` (any JSON value; no guide text), `json_schema`,
`regex`, `ebnf_grammar` (xgrammar's GBNF dialect) and `structural_tag`. Checks here need no
xgrammar; whether the guide compiles is `compiler.GuidedDecoder`'s question.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from refengine.errors import InvalidRequestError

GUIDE_TYPE_FIELD = "guided_decoding_guide_type"
GUIDE_FIELD = "guided_decoding_guide"
# A guide is compiled on the engine's thread before the request is queued: xgrammar's compile time
# grows with the guide (a 100 KB schema takes tens of ms, a 1 MB one seconds), and every other
# request waits meanwhile. Real schemas are a few KB; 64 KiB leaves a wide margin.
MAX_GUIDE_BYTES = 64 * 1024


class GuideType(str, enum.Enum):
    JSON = "json"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF_GRAMMAR = "ebnf_grammar"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True)
class GuidedDecodingParams:
    guide_type: GuideType
    guide: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "guide_type", GuideType(self.guide_type))
        except ValueError:
            names = ", ".join(t.value for t in GuideType)
            raise InvalidRequestError(GUIDE_TYPE_FIELD, f"unknown guide type {self.guide_type!r}; one of {names}") from None
        if not isinstance(self.guide, str):
            raise InvalidRequestError(GUIDE_FIELD, f"must be a string, got {type(self.guide).__name__}")
        size = len(self.guide.encode("utf-8"))
        if size > MAX_GUIDE_BYTES:
            raise InvalidRequestError(GUIDE_FIELD, f"is {size} bytes; at most {MAX_GUIDE_BYTES} bytes (64 KiB) are compiled")
        if self.guide_type is GuideType.JSON:
            return
        if not self.guide.strip():
            raise InvalidRequestError(GUIDE_FIELD, f"guide type {self.guide_type.value!r} needs a guide (guided_decoding_guide is empty)")

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.guide_type.value, self.guide)


def guided_params(guide_type: str | None, guide: str | None) -> GuidedDecodingParams | None:
    """The params of a request's two inputs; None when neither is given (or both are empty)."""
    guide_type = (guide_type or "").strip()
    guide = guide or ""
    if not guide_type:
        if guide.strip():
            raise InvalidRequestError(GUIDE_TYPE_FIELD, "a guided_decoding_guide was given without a guide type")
        return None
    return GuidedDecodingParams(guide_type, guide)  # type: ignore[arg-type]  # checked in __post_init__

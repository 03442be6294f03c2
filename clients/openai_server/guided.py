"""Structured output: the request's guide → TensorRT-LLM's guided_decoding_guide_type / guided_decoding_guide.

- `response_format` (OpenAI): `{"type": "json_object"}` → any JSON object; `{"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}}}` → that schema; `{"type": "text"}` → no guide.
- Extensions with vLLM's names: `guided_json` (a schema, as an object or a JSON string),
  `guided_regex` (a regular expression), `guided_grammar` (an EBNF grammar in xgrammar's GBNF dialect).

At most one of them per request. Whether the guide compiles is the server's answer (Triton's 400
names its input `guided_decoding_guide` and xgrammar's reason, before any token is generated);
`in_request_terms` names the request's own field instead, in the message and the error's `param`.
"""

from __future__ import annotations

import json
from typing import Any

from clients.openai_server.errors import OpenAIError, bad_request
from clients.openai_server.schemas import _Sampling

JSON_OBJECT_SCHEMA = '{"type": "object"}'
TRITON_GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
GUIDE_PARAMS = ("response_format", "guided_json", "guided_regex", "guided_grammar")


def guide_param(request: _Sampling) -> str | None:
    """The request field that carries its guide (None: no guide; `guide_of` refuses several)."""
    response_format = request.response_format
    text_format = response_format is not None and response_format.type == "text"  # response_format {"type": "text"}: no guide
    for param in GUIDE_PARAMS:
        value = getattr(request, param)
        if value is not None and not (param == "response_format" and text_format):
            return param
    return None


def in_request_terms(error: OpenAIError, param: str | None) -> OpenAIError:
    """Triton's refusal of a guide ("guided_decoding_guide: <reason>") as a refusal of `param`."""
    if param is None or error.status != 400:
        return error
    for name in TRITON_GUIDE_INPUTS:
        if error.message.startswith(f"{name}: "):
            reason = error.message[len(name) + 2 :]
            return bad_request(f"{param}: {reason}", param=param, code=error.code or "invalid_value")
    return error


def guide_of(request: _Sampling) -> dict[str, str]:
    """The two ensemble inputs of the request's guide ({} when it has none)."""
    guides: list[tuple[str, str, str]] = []  # (param, guide type, guide)
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        guides.append(("response_format", *_response_format_guide(response_format.type, response_format.json_schema)))
    if request.guided_json is not None:
        guides.append(("guided_json", "json_schema", _schema_text(request.guided_json, "guided_json")))
    if request.guided_regex is not None:
        guides.append(("guided_regex", "regex", request.guided_regex))
    if request.guided_grammar is not None:
        guides.append(("guided_grammar", "ebnf_grammar", request.guided_grammar))
    if len(guides) > 1:
        names = ", ".join(param for param, _, _ in guides)
        raise bad_request(f"give one guide, not several ({names})", param=guides[1][0])
    if not guides:
        return {}
    param, guide_type, guide = guides[0]
    if not guide.strip():
        raise bad_request(f"{param} is empty", param=param)
    return {"guided_decoding_guide_type": guide_type, "guided_decoding_guide": guide}


def _response_format_guide(kind: str, json_schema: dict[str, Any] | None) -> tuple[str, str]:
    if kind == "json_object":
        return "json_schema", JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        if not isinstance(json_schema, dict) or "schema" not in json_schema:
            raise bad_request('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}', param="response_format.json_schema")
        return "json_schema", _schema_text(json_schema["schema"], "response_format.json_schema.schema")
    raise bad_request(f"response_format {kind!r} is not supported; one of text, json_object, json_schema", param="response_format.type")


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema)
    raise bad_request(f"{param} must be a JSON schema (an object), got {type(schema).__name__}", param=param)

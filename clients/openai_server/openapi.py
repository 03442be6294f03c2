"""What `/openapi.json` documents: every request body and every answer of each route, so that
schema-driven clients and fuzzers (Schemathesis, tests/clients/test_openai_schema_fuzz.py) can use it.

The routes read their bodies themselves (for OpenAI's error shapes and the size and nesting
limits), so FastAPI cannot see them: each POST route names its body with `request_body(...)`
(`openapi_extra`), and `install` adds those pydantic schemas to the document's components.

The documented bodies are what this server accepts, not all that OpenAI's API defines: on top of
the validators, they say what `planning` refuses field by field (`planning_rules`): another
`model` than the served one (404), `n`, prompts or `max_tokens` beyond this server's limits, and
the features the engine cannot honour (tools, tool messages, `suffix`, alternatives on an engine
without logits, …; 400 `unsupported_parameter`). What depends on several fields (the prompt's length
against the context, `best_of` = n, `stream_options` without `stream`) is only described. Every
refused value still gets its 4xx, so a fuzzer's invalid data is refused as it expects. Error
answers all have `ErrorResponse`'s shape. FastAPI's automatic 422 is dropped: this app answers a
malformed request with 400, never 422. With API keys every `/v1/*` operation names the Bearer scheme and its
401 (and each generation route its 429 under a per-key limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from clients.openai_server import routes
from clients.openai_server.access import AccessPolicy
from clients.openai_server.defaults import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from clients.openai_server.planning import Context
from clients.openai_server.schemas import MAX_STOP_SEQUENCES, ErrorResponse

REF = "#/components/schemas/{model}"
_ERRORS = {
    400: "Malformed request: not UTF-8 JSON, nesting too deep (`json_too_deep`), a wrong type or value, an unknown "
    "or missing field; a feature the engine cannot honour (`unsupported_parameter`); n × prompts over the server's limit; "
    "a prompt or max_tokens beyond the model's context (`context_length_exceeded`); or Triton refusing the request.",
    404: "Unknown model (`model_not_found`), or unknown URL (`unknown_url`).",
    413: "The request body is larger than the server's limit (`request_too_large`).",
    500: "Triton failed the request.",
    502: "Triton answered something unexpected.",
    503: "Triton is unreachable or cannot serve the model (`triton_unavailable`).",
    504: "Triton did not answer in time (`timeout`).",
    401: "No API key, a wrong one, or an Authorization header that is not `Bearer KEY` (`invalid_api_key`).",
    429: "The API key already has its most concurrent requests in flight (`rate_limit_exceeded`); see Retry-After.",
}
SECURITY_SCHEME = "apiKey"
GENERATION_ERRORS = (400, 404, 413, 500, 502, 503, 504)
_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "required": ["data"],
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse, "description": _ERRORS[status]} for status in statuses}


def answers(model: type[BaseModel], description: str, *statuses: int, stream: str | None = None) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: 200 with `model` (or, with `stream`, an SSE stream too), then the errors."""
    ok: dict[str, Any] = {"model": model, "description": description}
    if stream is not None:
        ok["description"] = f"{description} With `stream: true`: {stream}"
        ok["content"] = {"text/event-stream": {"schema": _EVENT}}
    return {200: ok, **errors(*statuses)}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra=` of a route that reads a JSON `model` itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


def planning_rules(context: Context) -> dict[str, dict[str, dict[str, Any]]]:
    """Component → property → the schema documented for it: what `planning` refuses, field by field."""
    room = {"type": "integer", "minimum": 1, "maximum": context.model.max_seq_len - 1}
    n = _nullable({"type": "integer", "minimum": 1, "maximum": context.max_n}, f"At most {context.max_n} choices (n × prompts).")
    none = "Not supported: refused (400 `unsupported_parameter`) unless absent, null or empty."
    stop = {"type": "string", "minLength": 1}
    sampling = {
        "model": {"type": "string", "enum": [context.model.name], "description": "The served model's name (GET /v1/models)."},
        "max_tokens": _nullable(room, f"At most the context ({context.model.max_seq_len} tokens) minus the prompt's tokens."),
        "n": n,
        "stop": {
            "anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP_SEQUENCES}, {"type": "null"}],
            "description": f"Up to {MAX_STOP_SEQUENCES} non-empty sequences; the answer ends before the first occurrence.",
        },
        "logit_bias": _nullable(
            {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            },
            f"Token id (0..{context.tokenizer.vocab_size - 1}, as a string) → bias added to its logit before sampling, -100..100.",
        ),
    }
    return {
        "CompletionRequest": {
            **sampling,
            "max_tokens": _nullable(
                {"type": "integer", "minimum": 0, "maximum": context.model.max_seq_len - 1},
                f"At most the context ({context.model.max_seq_len} tokens) minus the prompt's tokens; 0 only with echo.",
            ),
            "prompt": _prompt_schema(context),
            "logprobs": _nullable(
                {"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS if context.model.generation_logits else 0},
                "The sampled token's log-probability and this many most likely alternatives per token"
                + ("" if context.model.generation_logits else " (this engine returns no alternatives: 0)")
                + ".",
            ),
            "suffix": _nullable({"type": "string", "maxLength": 0}, none),
            "best_of": _nullable({"type": "integer", "minimum": 1}, "1 or n: more candidates than answers are not supported."),
            "echo": _nullable(
                {"type": "boolean"},
                "The prompt before the answer; with `logprobs`, the prompt tokens' log-probs too. Not with `stream`"
                + ("" if context.model.context_logits else "; this engine returns none: not with `logprobs`")
                + ".",
            ),
        },
        "ChatCompletionRequest": {
            **sampling,
            "max_completion_tokens": _nullable(room, "As max_tokens (give one of them, or the same value)."),
            "top_logprobs": _nullable(
                {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS if context.model.generation_logits else 0},
                "With logprobs: this many most likely alternatives per token"
                + ("" if context.model.generation_logits else " (this engine returns none: 0)")
                + ".",
            ),
            **{name: _nullable({"type": "array", "maxItems": 0}, none) for name in ("tools", "functions")},
            **{name: {"enum": [None, "none"], "description": none} for name in ("tool_choice", "function_call")},
        },
        "ChatMessage": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"], "description": "Tool and function messages are not supported."},
            "tool_calls": _nullable({"type": "array", "maxItems": 0}, none),
            "function_call": _nullable({"type": "object", "maxProperties": 0}, none),
        },
        "ResponseFormat": {"type": {"type": "string", "enum": ["text"]}},
    }


def _prompt_schema(context: Context) -> dict[str, Any]:
    vocab = context.tokenizer.vocab_size
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}, "minItems": 1, "maxItems": context.model.max_input_len}
    return {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": context.max_n},
            ids,
            {"type": "array", "items": ids, "minItems": 1, "maxItems": context.max_n},
        ],
        "description": f"A string, a list of strings, token ids (0..{vocab - 1}), or a list of token-id lists (n answers each).",
    }


def _nullable(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}], "description": description}


def install(app: FastAPI, bodies: Sequence[type[BaseModel]], context: Context, policy: AccessPolicy) -> None:
    """Make `app.openapi()` document `bodies` (the models named by `request_body`) with `planning_rules(context)`,
    and the API keys `policy` asks for."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for body in bodies:
                schema = body.model_json_schema(ref_template=REF)
                for name, definition in {**schema.pop("$defs", {}), body.__name__: schema}.items():
                    if components.setdefault(name, definition) != definition:
                        raise RuntimeError(f"two different schemas are named {name!r}")
            for name, rules in planning_rules(context).items():
                properties = components[name]["properties"]
                for field, rule in rules.items():
                    kept = {key: value for key, value in properties[field].items() if key in ("title", "default")}
                    properties[field] = {**kept, **rule}
            _drop_422(document)
            _document_access(document, policy)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _drop_422(document: dict[str, Any]) -> None:
    for path in document.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)


def _document_access(document: dict[str, Any], policy: AccessPolicy) -> None:
    if policy.keys is None:
        return
    document["components"]["securitySchemes"] = {
        SECURITY_SCHEME: {"type": "http", "scheme": "bearer", "description": "An API key of this server: Authorization: Bearer KEY."}
    }
    for path, operations in document["paths"].items():
        if not path.startswith(routes.API_PREFIX):
            continue
        limited = path in routes.GENERATION_PATHS and policy.max_concurrent_per_key is not None
        for operation in operations.values():
            operation["security"] = [{SECURITY_SCHEME: []}]
            for status in (401, 429) if limited else (401,):
                operation["responses"][str(status)] = {
                    "description": _ERRORS[status],
                    "content": {"application/json": {"schema": {"$ref": REF.format(model=ErrorResponse.__name__)}}},
                }

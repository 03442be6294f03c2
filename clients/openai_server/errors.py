"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`, with their HTTP status.

Every failure the server reports goes through `OpenAIError`: bad requests (400; a body nesting
deeper than the limit is code `json_too_deep`), an unknown model (404, code `model_not_found`), a
body over the size limit (413), Triton refusing the request (400, with Triton's message), Triton
unreachable (503), Triton too slow (504), anything else (500).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from clients.errors import ClientError, ClientTimeoutError, ProtocolError, RequestError, ServerUnavailableError

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"
RATE_LIMITED = "requests"  # OpenAI's type of a 429 for too many requests
RETRY_AFTER_S = 1  # a slot frees when one of the key's requests ends, which the server cannot foresee


class OpenAIError(Exception):
    """An error answer: HTTP `status` and the fields of OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported_parameter")


def model_not_found(name: str, served: tuple[str, ...] = ()) -> OpenAIError:
    listed = f" Served models: {', '.join(served)}." if served else ""
    return OpenAIError(404, f"The model `{name}` does not exist.{listed}", type=INVALID_REQUEST, param="model", code="model_not_found")


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"Request body is larger than this server's limit of {limit} bytes.", code="request_too_large")


def json_too_deep(limit: int) -> OpenAIError:
    return bad_request(
        f"We could not parse the JSON body of your request: the JSON body nests deeper than {limit} levels "
        f"(arrays and objects inside each other), this server's limit.",
        code="json_too_deep",
    )


def missing_api_key() -> OpenAIError:
    return _unauthorized(
        "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    )


def not_bearer() -> OpenAIError:
    return _unauthorized("The Authorization header must use the Bearer scheme: Authorization: Bearer YOUR_KEY.")


def several_authorizations() -> OpenAIError:
    return _unauthorized("The request has more than one Authorization header; send one: Authorization: Bearer YOUR_KEY.")


def incorrect_api_key() -> OpenAIError:
    return _unauthorized("Incorrect API key provided.")


def _unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def too_many_concurrent(key_name: str, limit: int) -> OpenAIError:
    return OpenAIError(
        429,
        f"Too many concurrent requests for API key '{key_name}': at most {limit} at once. Retry when one of them has finished.",
        type=RATE_LIMITED,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def class_queue_full(class_name: str, bound: int) -> OpenAIError:
    return OpenAIError(
        429,
        f"Traffic class {class_name!r} has {bound} requests waiting, its serve.traffic max_queue. Retry later.",
        type=RATE_LIMITED,
        code="queue_full",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def from_validation_error(error: ValidationError) -> OpenAIError:
    """The first problem pydantic found, naming the field (`messages.0.role`) as `param`."""
    first = error.errors(include_url=False)[0]
    location = [str(part) for part in first["loc"]]
    param = ".".join(location) or None
    kind = first["type"]
    message = str(first["msg"]).removeprefix("Value error, ")
    if kind == "json_invalid":  # what json.loads accepts and pydantic's parser does not, e.g. a lone surrogate escape
        return bad_request(f"We could not parse the JSON body of your request: {message}", code="invalid_json")
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    if message.startswith(f"{param}") or message.startswith(location[-1] if location else "\0"):
        return bad_request(message, param=param, code="invalid_value" if kind == "value_error" else "invalid_type")
    code = "invalid_value" if kind in ("value_error", "greater_than_equal", "less_than_equal", "greater_than", "too_short", "literal_error") else "invalid_type"
    return bad_request(f"Invalid value for '{param}': {message}.", param=param, code=code)


def from_client_error(error: ClientError | TypeError | ValueError) -> OpenAIError:
    """What Triton (through `clients`) said, as the status the OpenAI client should see. A value the
    client library refuses before sending (a TypeError / ValueError naming a `field`) is a 400."""
    if isinstance(error, ServerUnavailableError):
        return OpenAIError(503, f"The inference server is unavailable: {error}", type=UNAVAILABLE, code="triton_unavailable")
    if isinstance(error, ClientTimeoutError):
        return OpenAIError(504, f"The inference server did not answer in time: {error}", type=SERVER_ERROR, code="timeout")
    if isinstance(error, RequestError):
        message = _without_ensemble_prefix(error.message)
        if _model_process_down(message):
            return OpenAIError(503, f"The inference server cannot serve the model: {message}", type=UNAVAILABLE, code="triton_unavailable")
        if error.status in (None, "INVALID_ARGUMENT", "OUT_OF_RANGE"):
            return bad_request(message)
        if error.status in ("UNAVAILABLE", "NOT_FOUND"):
            return OpenAIError(503, f"The inference server cannot serve the model: {message}", type=UNAVAILABLE, code="triton_unavailable")
        return OpenAIError(500, f"The inference server failed the request: {message}", type=SERVER_ERROR)
    if isinstance(error, (TypeError, ValueError)):
        return bad_request(str(error), param=getattr(error, "field", None))
    if isinstance(error, ProtocolError):
        return OpenAIError(502, f"The inference server answered something unexpected: {error}", type=SERVER_ERROR)
    return OpenAIError(500, f"The request failed: {error}", type=SERVER_ERROR)


# Triton's Python backend says this (TRITONSERVER_ERROR_INTERNAL) when a model's stub process has died (seen here:
# "Stub process 'preprocessing_0_0' is not healthy."); a streamed error arrives without its status, so the text is
# all there is to tell it from a bad request.
_STUB_DOWN = re.compile(r"Stub process '[^']*' is not healthy")


def _model_process_down(message: str) -> bool:
    return _STUB_DOWN.search(message) is not None


def _without_ensemble_prefix(message: str) -> str:
    """Triton prefixes in-stream errors with "in ensemble 'name', "; the rest is the model's own text."""
    if message.startswith("in ensemble '"):
        _, _, rest = message.partition("', ")
        return rest or message
    return message

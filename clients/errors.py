"""The errors a client raises. Every one is a `ClientError`; none is retried except `ServerUnavailableError`."""

from __future__ import annotations

import builtins


class ClientError(Exception):
    """Base of every error of this package."""


class RequestError(ClientError):
    """Triton refused or failed the request; `message` is Triton's own text.

    `status` is the HTTP status code (int) over HTTP, the gRPC status name (str, e.g.
    "INVALID_ARGUMENT") for an RPC-level failure, or None when Triton reports the error inside
    a gRPC stream (such errors carry only a message). Never retried.
    """

    def __init__(self, status: int | str | None, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"[{status}] {message}" if status is not None else message)


class InvalidRequestError(ClientError, builtins.TypeError, builtins.ValueError):
    """A request value the client refuses before sending it; `field` names the input.

    Also a TypeError and a ValueError (a wrong type or an impossible value). Checked here because
    Triton cannot answer every such value well: over HTTP, a JSON value of the wrong type for an
    input (e.g. `"max_tokens": "abc"`) gets HTTP 500 from Triton's own JSON-to-tensor conversion,
    and an integer beyond the input's datatype (INT32) is silently wrapped (2**32 + 5 becomes 5).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class ServerUnavailableError(ClientError, builtins.ConnectionError):
    """The server could not be reached (connection refused, gRPC UNAVAILABLE), after every retry."""

    def __init__(self, url: str, reason: str, *, attempts: int = 1) -> None:
        self.url = url
        self.reason = reason
        self.attempts = attempts
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        super().__init__(f"cannot reach Triton at {url} ({tries}): {reason}")

    def with_attempts(self, attempts: int) -> ServerUnavailableError:
        return ServerUnavailableError(self.url, self.reason, attempts=attempts)


class ClientTimeoutError(ClientError, builtins.TimeoutError):
    """The request did not finish within the client's timeout (gRPC deadline, HTTP read timeout).

    Over gRPC the deadline also cancels the request on the server.
    """

    def __init__(self, timeout: float, detail: str = "") -> None:
        self.timeout = timeout
        super().__init__(f"no complete answer within {timeout:g} s" + (f": {detail}" if detail else ""))


class ProtocolError(ClientError):
    """The server answered something this client cannot read (not the ensemble's contract)."""

"""Who may ask: API keys (`Authorization: Bearer KEY`) on every `/v1/*` route, and per key at most N generation
requests at once, so that one client cannot hold every slot of the engine.

A plain ASGI middleware in front of the routes: it answers 401 / 429 before the body is read, and otherwise puts
the key's name into the request's state (`KEY_NAME_STATE`), where the metrics read it. `/health` stays open, and
`/metrics` unless `metrics_need_key` (Prometheus scrapes it on the private network). Keys are compared in constant
time: the SHA-256 of what was sent against that of every key, each with `hmac.compare_digest`, without stopping at
a match. The keys themselves are not kept (only their digests), nor ever logged, echoed or labelled.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from clients.api_keys import ApiKey
from clients.openai_server import errors, routes
from clients.openai_server.errors import OpenAIError

KEY_NAME_STATE = "api_key_name"
NO_KEY = "-"  # the metrics' `key` label of a request without a valid key (no key name can be this)


class KeyRing:
    """The names of the keys and the digests to compare against."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        self._digests = tuple((key.name, _digest(key.secret.encode("ascii"))) for key in keys)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._digests)

    def name_of(self, token: bytes) -> str | None:
        """The name of the key `token` is, or None; the same work whichever key matches, or none."""
        sent = _digest(token)
        found = None
        for name, digest in self._digests:
            if hmac.compare_digest(sent, digest) and found is None:
                found = name
        return found

    def __repr__(self) -> str:
        return f"KeyRing({', '.join(self.names)})"


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class AccessPolicy:
    """`keys`: None serves everyone (no key asked). `max_concurrent_per_key`: generation requests one key may have
    in flight (None: no limit). `metrics_need_key`: `/metrics` asks for a key too."""

    keys: KeyRing | None = None
    max_concurrent_per_key: int | None = None
    metrics_need_key: bool = False

    def __post_init__(self) -> None:
        if self.max_concurrent_per_key is not None and self.max_concurrent_per_key < 1:
            raise ValueError(f"--max-concurrent-per-key must be at least 1, got {self.max_concurrent_per_key}")
        if self.keys is None and (self.max_concurrent_per_key is not None or self.metrics_need_key):
            given = "--max-concurrent-per-key" if self.max_concurrent_per_key is not None else "--metrics-need-key"
            raise ValueError(f"{given} needs API keys (--api-key-file FILE or the TRTLLM_PIPELINE_API_KEYS variable)")

    def describe(self) -> str:
        """One line for the start-up message: the key names (never the keys), the limit, /metrics."""
        if self.keys is None:
            return "no API keys: every client is served (give --api-key-file or TRTLLM_PIPELINE_API_KEYS to ask for one)"
        limit = f"at most {self.max_concurrent_per_key} concurrent requests per key" if self.max_concurrent_per_key else "no per-key limit"
        metrics = "/metrics needs a key" if self.metrics_need_key else "/metrics open"
        return f"API keys: {', '.join(self.keys.names)}; {limit}; /health and {metrics}"


def key_name(request: Any) -> str | None:
    """The name of the API key a request came with (a Starlette request); None on a server without keys."""
    name = request.scope.get("state", {}).get(KEY_NAME_STATE)
    return name if isinstance(name, str) else None


def guarded(path: str, policy: AccessPolicy) -> bool:
    return path.startswith(routes.API_PREFIX) or (path == routes.METRICS and policy.metrics_need_key)


def bearer_key_name(headers: Sequence[tuple[bytes, bytes]], keys: KeyRing) -> str:
    """The name of the key sent as `Authorization: Bearer KEY`; an OpenAIError (401) otherwise."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if not values:
        raise errors.missing_api_key()
    if len(values) > 1:
        raise errors.several_authorizations()
    scheme, _, token = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        raise errors.not_bearer()
    token = token.strip()
    if not token:
        raise errors.missing_api_key()
    name = keys.name_of(token)
    if name is None:
        raise errors.incorrect_api_key()
    return name


class Slots:
    """Generation requests in flight per key name (one event loop: no lock needed between check and count)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._in_flight: dict[str, int] = {}

    def take(self, name: str) -> bool:
        held = self._in_flight.get(name, 0)
        if self.limit is not None and held >= self.limit:
            return False
        self._in_flight[name] = held + 1
        return True

    def give_back(self, name: str) -> None:
        held = self._in_flight.pop(name) - 1
        if held:
            self._in_flight[name] = held

    def in_flight(self, name: str) -> int:
        return self._in_flight.get(name, 0)


def install(app: FastAPI, policy: AccessPolicy) -> None:
    """Guard `app` with `policy` (nothing to do without keys). Install it before the middleware that counts answers,
    so that the counting one, added later and so outside it, sees the 401s and 429s too."""
    if policy.keys is None:
        return
    keys: KeyRing = policy.keys  # declared: mypy carries no narrowing into the class below
    slots = Slots(policy.max_concurrent_per_key)
    app.state.key_slots = slots

    class AccessControl:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not guarded(scope["path"], policy):
                await self.inner(scope, receive, send)
                return
            try:
                name = bearer_key_name(scope["headers"], keys)
            except OpenAIError as refusal:
                await _refuse(refusal, scope, receive, send)
                return
            scope.setdefault("state", {})[KEY_NAME_STATE] = name
            if scope["path"] not in routes.GENERATION_PATHS:
                await self.inner(scope, receive, send)
                return
            if not slots.take(name):
                await _refuse(errors.too_many_concurrent(name, slots.limit or 0), scope, receive, send)
                return
            try:
                await self.inner(scope, receive, send)
            finally:
                slots.give_back(name)

    app.add_middleware(AccessControl)


async def _refuse(refusal: OpenAIError, scope: dict[str, Any], receive: Any, send: Any) -> None:
    await JSONResponse(refusal.body(), status_code=refusal.status, headers=refusal.headers)(scope, receive, send)

"""Schemathesis against the OpenAI front end's own `/openapi.json`, in process (ASGI), over a scripted
Triton client: every answer must be documented (status code, content type, body schema), no
answer may be a 5xx, a body the schema calls invalid must be refused, and a body the schema calls
valid must pass the server's validation (it may still be refused for what only planning knows:
the context length, features the engine cannot honour, n × prompts over the limit).

Bounded and reproducible: derandomized, no example database, no deadline; per operation the
schema's examples, Schemathesis' coverage phase (boundary and type-mutation cases) and 50 fuzzed
cases, valid and invalid; no stateful phase (the API has no links). Schemathesis' own `positive_data_acceptance` check (any valid body
answers 2xx) is replaced by `documented_bodies_pass_validation` below, since a 400 for a
valid-looking request whose prompt is longer than the context is correct here.

The same again with API keys configured (#36): Schemathesis sends a key as `Authorization: Bearer`, and its
`ignored_auth` check also sends each request without one and with a wrong one, which must be refused (401).
"""

from __future__ import annotations

import json

import schemathesis
from pydantic import ValidationError

from clients.api_keys import parse_api_keys
from clients.openai_server import AccessPolicy, KeyRing, ServerSettings, create_app
from clients.openai_server.schemas import ChatCompletionRequest, CompletionRequest
from clients.openai_server.tokenizer import PromptTokenizer
from tests.clients.test_openai_server import MODEL, TOKENIZER_DIR, FakeStream, FakeTriton

MAX_EXAMPLES = 50
CONFIG = {
    "suppress-health-check": ["too_slow"],  # the only health check that depends on the machine's speed
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    "phases": {"stateful": {"enabled": False}},
    "checks": {"positive_data_acceptance": {"enabled": False}},
}
BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


def words(request):
    """One token (" w") per max_tokens; the stop sequences and sampling are the server's business."""
    return FakeStream([(" w", [-0.5])] * request.max_tokens)


KEY = "fuzz-key-0123456789abcdef"


def fuzzed(access: AccessPolicy, config: dict):
    """The schema of an app (over a scripted Triton), ready for Schemathesis."""
    app = create_app(ServerSettings("127.0.0.1:1", MODEL, max_n=4, access=access), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    app.state.triton = FakeTriton(words)  # kept by the lifespan, which Schemathesis starts at the first request
    loaded = schemathesis.openapi.from_dict(app.openapi(), config=schemathesis.Config.from_dict(config))
    loaded.app = app
    return loaded


# Loaded eagerly: schemathesis.pytest.from_fixture (lazy) reads a pytest node attribute that pytest 9.2 removed.
schema = fuzzed(AccessPolicy(), CONFIG)
keyed_schema = fuzzed(
    AccessPolicy(KeyRing(parse_api_keys(f"fuzz:{KEY}", "fuzz")), max_concurrent_per_key=4),
    {**CONFIG, "headers": {"Authorization": f"Bearer {KEY}"}},
)


def documented_bodies_pass_validation(ctx, response, case):
    """A body generated as valid from the documented schema is valid for the server's schema too:
    the documentation and the validators say the same."""
    model = BODIES.get(case.operation.path)
    if model is None or case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return None
    try:
        model.model_validate_json(json.dumps(case.body))
    except ValidationError as error:
        raise AssertionError(f"the documented schema accepts a body the server refuses: {error}") from None
    assert response.status_code != 400 or response.json()["error"]["code"] not in ("invalid_type", "unknown_parameter", "invalid_json"), response.text
    return None


@schema.parametrize()
def test_every_answer_is_documented_and_no_request_fails_the_server(case):
    case.call_and_validate(additional_checks=[documented_bodies_pass_validation])


def the_key_is_accepted(ctx, response, case):
    """A request that carries the key is never refused for it (Schemathesis' coverage phase also sends some without
    the header, which must be 401: `ignored_auth` and the documented answers check those)."""
    if response.request.headers.get("Authorization") == f"Bearer {KEY}":
        assert response.status_code != 401, response.text
    else:
        assert response.status_code == 401, response.text
    return None


@keyed_schema.parametrize()
def test_with_api_keys_every_answer_is_documented_and_no_request_fails_the_server(case):
    case.call_and_validate(additional_checks=[documented_bodies_pass_validation, the_key_is_accepted])

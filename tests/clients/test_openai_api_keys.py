"""API keys of the OpenAI front end (#36), without Triton: the key file and variable syntax and every bad input of the
issue, the Bearer check and its 401s, the per-key concurrency limit (429), the metrics' key label, what /openapi.json
documents, and that no key reaches a message or a log.

The real server (uvicorn, the real tritonserver, the official `openai` client) is in tests/integration/test_openai_server.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from clients.api_keys import API_KEYS_VARIABLE, ApiKey, ApiKeyError, configured_api_keys, given_api_keys, parse_api_keys, read_api_key_file
from clients.openai_server import AccessPolicy, KeyRing, ServerSettings, create_app
from clients.openai_server.access import bearer_key_name
from clients.openai_server.errors import OpenAIError
from clients.openai_server.metrics import REQUESTS
from clients.openai_server.tokenizer import PromptTokenizer
from pipeline.errors import SpecError
from tests.clients.test_openai_server import MODEL, TOKENIZER_DIR, FakeStream, FakeTriton, echo_words

REPO = Path(__file__).resolve().parents[2]
ALICE, BOB = "alice-key-0123456789abcdef", "Bb0b_kEy.9876543210~+/=="
KEYS = parse_api_keys(f"alice:{ALICE}\n{BOB}\n", "test keys")
COMPLETION = {"model": "tiny", "prompt": "x", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def refusal(text: str) -> str:
    with pytest.raises(ApiKeyError) as raised:
        parse_api_keys(text, "keys.txt")
    return str(raised.value)


# -- the syntax ----------------------------------------------------------------------------------------------
def test_keys_are_named_or_numbered_and_whitespace_comments_and_commas_are_handled():
    text = f"# clients of the front end\r\n\n  alice : {ALICE}   \r\n{BOB}\t\n\nci-runner.2:{'c' * 16}, {'d' * 16}\n"
    keys = parse_api_keys(text, "keys.txt")
    assert [key.name for key in keys] == ["alice", "key2", "ci-runner.2", "key4"]
    assert [key.secret for key in keys] == [ALICE, BOB, "c" * 16, "d" * 16]  # trailing whitespace and CR are not part of a key
    assert ALICE not in repr(keys) and repr(keys[0]) == "ApiKey(name='alice')"


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "keys.txt holds no API key"),
        ("\n   \n# only a comment\n\n", "keys.txt holds no API key"),
        (f"a:{'a' * 16}\n\nb:{'b' * 16}\na:{'c' * 16}\n", "keys.txt line 4: the key's name is also the name at line 1; names must be unique"),
        (f"{'a' * 16}\nkey1:{'b' * 16}\n", "keys.txt line 2: the key's name is also the name at line 1"),
        (f"a:{ALICE}\n\nb:{ALICE}\n", "keys.txt line 3: the same key as at line 1; give each key once"),
        (f"{'a' * 16}\nshort:0123456789abcde\n", "keys.txt line 2: the key is shorter than 16 characters"),
        (f"{'a' * 16}, 0123456789abcde", "keys.txt line 1, entry 2: the key is shorter than 16 characters"),
        (f"{'k' * 513}", "keys.txt line 1: the key is longer than 512 characters"),
        ("with space inside 0123456789", "keys.txt line 1: the key has a character a Bearer token cannot hold"),
        ("é0123456789abcdefgh", "keys.txt line 1: the key has a character a Bearer token cannot hold"),
        (f"{ALICE}:alice", "keys.txt line 1: the key is shorter than 16 characters"),  # written the wrong way round
        (f"9lives:{ALICE}", "keys.txt line 1: the part before ':' is not a name"),
    ],
    ids=[
        "empty",
        "blank-and-comments",
        "duplicate-name",
        "name-of-a-numbered-key",
        "duplicate-key",
        "short",
        "short-entry",
        "long",
        "space",
        "not-ascii",
        "key-name-reversed",
        "name-not-a-name",
    ],
)
def test_every_bad_key_list_is_refused_naming_the_line_and_never_a_key(text, says):
    message = refusal(text)
    assert says in message
    for entry in text.replace(",", "\n").splitlines():
        for part in entry.split(":"):
            if len(part.strip()) >= 8:  # no key, nor a name that might be one
                assert part.strip() not in message, message


def test_the_file_and_the_variable(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"alice:{ALICE}\n")
    assert configured_api_keys(key_file, {}) == (ApiKey("alice", ALICE),)
    assert configured_api_keys(None, {API_KEYS_VARIABLE: f"alice:{ALICE},{BOB}"}) == (ApiKey("alice", ALICE), ApiKey("key2", BOB))
    assert configured_api_keys(None, {}) is None  # no keys: open, as before
    with pytest.raises(ApiKeyError, match=f"{API_KEYS_VARIABLE} holds no API key"):
        configured_api_keys(None, {API_KEYS_VARIABLE: " , "})  # set but empty is not "no keys"
    with pytest.raises(ApiKeyError, match=f"both --api-key-file and {API_KEYS_VARIABLE} are set"):
        configured_api_keys(key_file, {API_KEYS_VARIABLE: BOB})
    with pytest.raises(ApiKeyError, match="cannot read API key file .*missing: No such file"):
        read_api_key_file(tmp_path / "missing")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + ALICE.encode())
    with pytest.raises(ApiKeyError, match="is not UTF-8 text"):
        read_api_key_file(tmp_path / "binary")
    (tmp_path / "empty").write_text("")
    with pytest.raises(ApiKeyError, match=f"API key file {tmp_path / 'empty'} holds no API key"):
        read_api_key_file(tmp_path / "empty")


def test_a_client_sends_the_first_key_of_the_file_else_of_the_variable(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"# mine\nalice:{ALICE}\n{BOB}\n")
    assert given_api_keys(key_file, {API_KEYS_VARIABLE: BOB})[0].secret == ALICE  # the flag wins over the variable
    assert given_api_keys(None, {API_KEYS_VARIABLE: f"{BOB},alice:{ALICE}"})[0].secret == BOB
    assert given_api_keys(None, {}) is None


# -- the check ------------------------------------------------------------------------------------------------
@pytest.fixture
def keyed(tokenizer):
    """A client of an app with KEYS (alice at most 1 generation request at once), over a scripted Triton."""
    made = []

    def make(script=echo_words, **policy):
        app = create_app(ServerSettings("127.0.0.1:1", MODEL, access=AccessPolicy(KeyRing(KEYS), **policy)), tokenizer=tokenizer)
        client = TestClient(app)
        client.__enter__()
        app.state.triton = FakeTriton(script)
        made.append(client)
        return client

    yield make
    for client in made:
        client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def tokenizer():
    return PromptTokenizer(TOKENIZER_DIR)


ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny", None),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {**COMPLETION, "stream": True}),
    ("GET", "/v1/nothing", None),
]


def test_no_key_or_a_wrong_one_is_a_401_in_openais_shape_on_every_v1_route(keyed):
    client = keyed()
    for method, path, body in ROUTES:
        for headers, says in (
            ({}, "You didn't provide an API key"),
            (bearer(ALICE[:-1] + "X"), "Incorrect API key provided."),
            (bearer(ALICE + "X"), "Incorrect API key provided."),
            (bearer(""), "You didn't provide an API key"),
        ):
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (path, response.text)
            assert response.json() == {
                "error": {"message": response.json()["error"]["message"], "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
            }
            assert says in response.json()["error"]["message"] and response.headers["www-authenticate"] == "Bearer"
            assert ALICE[:12] not in response.text


def test_the_right_key_is_served_on_completions_chat_models_and_streams(keyed):
    client = keyed()
    for key in (ALICE, BOB):
        assert client.get("/v1/models", headers=bearer(key)).json()["data"][0]["id"] == "tiny"
        assert client.get("/v1/models/tiny", headers=bearer(key)).status_code == 200
        assert client.post("/v1/completions", json=COMPLETION, headers=bearer(key)).json()["choices"][0]["text"] == " w w"
        assert client.post("/v1/chat/completions", json=CHAT, headers=bearer(key)).json()["choices"][0]["message"]["content"] == " w w"
        streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert client.get("/v1/models", headers={"authorization": f"bearer   {ALICE}"}).status_code == 200  # scheme case, spaces
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {ALICE}   "}).status_code == 200  # trailing whitespace
    assert client.post("/v1/completions", json={"model": "gpt-4", "prompt": "x"}, headers=bearer(ALICE)).status_code == 404


def test_health_stays_open_and_metrics_only_asks_for_a_key_when_told(keyed):
    client = keyed()
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    closed = keyed(metrics_need_key=True)
    assert closed.get("/metrics").status_code == 401 and closed.get("/metrics", headers=bearer(BOB)).status_code == 200
    assert closed.get("/health").status_code == 200


@pytest.mark.parametrize(
    "value, says",
    [
        (f"Basic {ALICE}", "must use the Bearer scheme"),
        (ALICE, "must use the Bearer scheme"),  # the key alone, without a scheme
        (f"Token {ALICE}", "must use the Bearer scheme"),
        ("Bearer " + "k" * 10_240, "Incorrect API key provided."),  # a 10 KB header
        ("Bearer", "You didn't provide an API key"),
    ],
    ids=["basic", "no-scheme", "other-scheme", "10kb", "bearer-alone"],
)
def test_an_authorization_that_is_not_a_bearer_key_is_a_401_that_echoes_nothing(keyed, value, says):
    response = keyed().post("/v1/completions", json=COMPLETION, headers={"Authorization": value})
    assert response.status_code == 401 and says in response.json()["error"]["message"]
    assert ALICE not in response.text and "kkkkkkkk" not in response.text


def test_two_authorization_headers_are_refused():
    with pytest.raises(OpenAIError) as raised:
        bearer_key_name([(b"authorization", f"Bearer {ALICE}".encode()), (b"Authorization", f"Bearer {BOB}".encode())], KeyRing(KEYS))
    assert raised.value.status == 401 and "more than one Authorization header" in raised.value.message


def test_a_key_is_compared_with_every_key_in_constant_time(monkeypatch):
    compared = []
    compare_digest = hmac.compare_digest

    def counting(a, b):
        compared.append((len(a), len(b)))
        return compare_digest(a, b)

    monkeypatch.setattr("clients.openai_server.access.hmac.compare_digest", counting)
    ring = KeyRing(KEYS)
    assert ring.name_of(ALICE.encode()) == "alice" and ring.name_of(BOB.encode()) == "key2" and ring.name_of(b"x" * 10_000) is None
    assert compared == [(32, 32)] * 6  # digests of equal length, every key every time, also after a match
    assert "alice" in repr(ring) and ALICE not in repr(ring)


# -- the per-key limit ----------------------------------------------------------------------------------------
def test_a_key_at_its_limit_gets_429_with_retry_after_while_another_key_is_served(tokenizer):
    release = asyncio.Event()

    def script(request):
        return HeldStream(release) if request.prompt == "hold" else echo_words(request)

    app = create_app(ServerSettings("127.0.0.1:1", MODEL, access=AccessPolicy(KeyRing(KEYS), max_concurrent_per_key=1)), tokenizer=tokenizer)
    app.state.triton = FakeTriton(script)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://front") as client:
            held = asyncio.create_task(client.post("/v1/completions", json={**COMPLETION, "prompt": "hold"}, headers=bearer(ALICE)))
            while app.state.key_slots.in_flight("alice") == 0:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(ALICE))
            other = await client.post("/v1/completions", json=COMPLETION, headers=bearer(BOB))
            listed = await client.get("/v1/models", headers=bearer(ALICE))  # only generation requests take a slot
            release.set()
            first = await held
            again = await client.post("/v1/completions", json=COMPLETION, headers=bearer(ALICE))
            metrics = (await client.get("/metrics")).text
            return refused, other, listed, first, again, metrics

    refused, other, listed, first, again, metrics = asyncio.run(scenario())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == {
        "message": "Too many concurrent requests for API key 'alice': at most 1 at once. Retry when one of them has finished.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert (other.status_code, listed.status_code, first.status_code, again.status_code) == (200, 200, 200, 200)
    assert app.state.key_slots.in_flight("alice") == 0
    assert f'{REQUESTS}{{endpoint="/v1/chat/completions",key="alice",status="429"}} 1.0' in metrics
    assert f'{REQUESTS}{{endpoint="/v1/completions",key="alice",status="200"}} 2.0' in metrics
    assert f'{REQUESTS}{{endpoint="/v1/completions",key="key2",status="200"}} 1.0' in metrics


class HeldStream(FakeStream):
    """One token once `release` is set."""

    def __init__(self, release: asyncio.Event) -> None:
        super().__init__([(" w", [-0.5])])
        self.release = release

    async def _deltas(self):
        await self.release.wait()
        async for delta in super()._deltas():
            yield delta


def test_the_metrics_label_401s_with_no_key_and_never_with_a_key(keyed):
    client = keyed()
    client.post("/v1/completions", json=COMPLETION, headers=bearer(ALICE + "wrong"))
    client.get("/v1/models/tiny", headers=bearer(BOB))
    client.get("/v1/" + "x" * 200)
    metrics = client.get("/metrics").text
    assert f'{REQUESTS}{{endpoint="/v1/completions",key="-",status="401"}} 1.0' in metrics
    assert f'{REQUESTS}{{endpoint="/v1/models/{{model_id}}",key="key2",status="200"}} 1.0' in metrics
    assert f'{REQUESTS}{{endpoint="other",key="-",status="401"}} 1.0' in metrics  # a URL does not make a series
    assert ALICE not in metrics and BOB not in metrics


def test_openapi_documents_the_bearer_scheme_and_its_answers(keyed):
    document = keyed(max_concurrent_per_key=2).get("/openapi.json").json()
    [(name, scheme)] = document["components"]["securitySchemes"].items()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert (operation.get("security") == [{name: []}]) == path.startswith("/v1/"), path
            assert ("401" in operation["responses"]) == path.startswith("/v1/")
            assert ("429" in operation["responses"]) == (path in ("/v1/completions", "/v1/chat/completions"))


def test_a_limit_or_closed_metrics_without_keys_is_refused():
    with pytest.raises(ValueError, match="--max-concurrent-per-key needs API keys"):
        AccessPolicy(max_concurrent_per_key=2)
    with pytest.raises(ValueError, match="--metrics-need-key needs API keys"):
        AccessPolicy(metrics_need_key=True)
    with pytest.raises(ValueError, match="--max-concurrent-per-key must be at least 1, got 0"):
        AccessPolicy(KeyRing(KEYS), max_concurrent_per_key=0)
    assert "alice, key2" in AccessPolicy(KeyRing(KEYS), 3).describe() and ALICE not in AccessPolicy(KeyRing(KEYS)).describe()


# -- the command ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, says",
    [
        ("", "holds no API key"),
        ("\n\n", "holds no API key"),
        (f"a:{ALICE}\na:{BOB}\n", "line 2: the key's name is also the name at line 1"),
        (f"{ALICE}\nfifteen-chars-x\n", "line 2: the key is shorter than 16 characters"),
    ],
    ids=["empty", "blank-lines", "duplicate-names", "short"],
)
def test_the_openai_command_refuses_a_bad_key_file_before_building_anything(tmp_path, content, says, capsys, caplog, monkeypatch):
    from pipeline.cli import main

    monkeypatch.delenv(API_KEYS_VARIABLE, raising=False)
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "keys.txt"
    key_file.write_text(content)
    store = tmp_path / "store"
    code = main(["--artifacts", str(store), "openai", str(REPO / "build_configs" / "tiny-cpu.yaml"), "--api-key-file", str(key_file)])
    captured = capsys.readouterr()
    assert code == SpecError.exit_code and says in captured.err and str(key_file) in captured.err
    assert not store.exists()  # nothing was built
    for secret in (ALICE, BOB, "fifteen-chars-x"):
        assert secret not in captured.out + captured.err + caplog.text


def test_the_openai_command_refuses_a_limit_without_keys(tmp_path, monkeypatch):
    from pipeline.cli import run_cli

    monkeypatch.delenv(API_KEYS_VARIABLE, raising=False)
    config = str(REPO / "build_configs" / "tiny-cpu.yaml")
    with pytest.raises(SpecError, match="--max-concurrent-per-key needs API keys"):
        run_cli(["--artifacts", str(tmp_path / "store"), "openai", config, "--max-concurrent-per-key", "2"], Console())
    monkeypatch.setenv(API_KEYS_VARIABLE, ALICE)
    with pytest.raises(SpecError, match=f"both --api-key-file and {API_KEYS_VARIABLE} are set"):
        run_cli(["--artifacts", str(tmp_path / "store"), "openai", config, "--api-key-file", str(tmp_path / "k")], Console())
    assert not (tmp_path / "store").exists()

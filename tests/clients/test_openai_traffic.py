"""Traffic classes in the OpenAI front end (clients/openai_server/traffic.py): which class a request is in, from its API
key, `service_tier` and vLLM's `priority`, the priority the engine then receives, and every refusal of issue 42 (400
naming the field and listing the classes, 403 naming the class and never the key), over a scripted Triton client."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient

from clients.api_keys import ApiKey
from clients.openai_server import AccessPolicy, KeyRing, ServerSettings, create_app
from clients.openai_server.model import TRAFFIC_PARAMETER, ServedModel
from clients.openai_server.tokenizer import PromptTokenizer
from clients.openai_server.traffic import TrafficTable, TrafficTableError
from pipeline.config.spec import ServeSpec
from pipeline.config.spec.traffic import TrafficSpec
from pipeline.render.traffic import traffic_parameters
from tests.clients.test_openai_server import MODEL, TOKENIZER_DIR, FakeTriton, echo_words

SPEC = {
    "classes": [
        {"name": "batch", "priority": 0.0, "service_tiers": ["flex"]},
        {"name": "interactive", "priority": 1.0, "ttft_slo_ms": 500, "service_tiers": ["priority"]},
        {"name": "standard", "priority": 0.5},
    ],
    "default_class": "standard",
    "keys": {"chat-app": {"default": "interactive"}, "nightly": {"default": "batch", "allowed": ["batch", "standard"]}},
}
CHAT_KEY = "chat-app-secret-0123456789"
NIGHTLY_KEY = "nightly-secret-0123456789"


def table(spec: dict = SPEC) -> TrafficTable:
    """As the front end reads it: the spec's table, rendered into the preprocessing parameter the package stage writes."""
    serve = ServeSpec(traffic=TrafficSpec.model_validate(spec))
    return TrafficTable.from_json(traffic_parameters(serve)[TRAFFIC_PARAMETER], "test")


@pytest.fixture(scope="module")
def server():
    model = dataclasses.replace(MODEL, traffic=table(), takes_priority=True)
    keys = KeyRing((ApiKey("chat-app", CHAT_KEY), ApiKey("nightly", NIGHTLY_KEY), ApiKey("ops", "ops-secret-0123456789abc")))
    app = create_app(ServerSettings("127.0.0.1:1", model, access=AccessPolicy(keys)), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    with TestClient(app) as client:
        app.state.triton = FakeTriton(echo_words)
        yield client, app.state.triton


def ask(server, key: str, path: str = "/v1/completions", **fields):
    client, triton = server
    before = len(triton.requests)
    body = {"model": "tiny", "max_tokens": 1, **({"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}), **fields}
    response = client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
    sent = triton.requests[before:]
    return response, [request.priority for request in sent]


@pytest.mark.parametrize(
    "key, fields, priority",
    [
        (CHAT_KEY, {}, 1.0),  # the key's default class
        ("ops-secret-0123456789abc", {}, 0.5),  # a key without one: the table's default
        ("ops-secret-0123456789abc", {"service_tier": "priority"}, 1.0),  # a tier a class lists
        ("ops-secret-0123456789abc", {"service_tier": "batch"}, 0.0),  # a class by name
        ("ops-secret-0123456789abc", {"service_tier": "auto"}, 0.5),  # OpenAI's default: the key's class
        (CHAT_KEY, {"service_tier": "default"}, 1.0),
        ("ops-secret-0123456789abc", {"priority": 0}, 1.0),  # vLLM's polarity: 0 is the highest class
        ("ops-secret-0123456789abc", {"priority": 1}, 0.5),
        ("ops-secret-0123456789abc", {"priority": 2}, 0.0),
        ("ops-secret-0123456789abc", {"priority": 2, "service_tier": "flex"}, 0.0),  # both, the same class
        (NIGHTLY_KEY, {"service_tier": "standard"}, 0.5),  # an allowed class
    ],
)
def test_the_class_decides_the_priority_the_engine_receives(server, key, fields, priority):
    response, sent = ask(server, key, **fields)
    assert response.status_code == 200, response.text
    assert sent == [priority]


def test_every_choice_of_a_chat_request_carries_it(server):
    response, sent = ask(server, CHAT_KEY, "/v1/chat/completions", n=3)
    assert response.status_code == 200, response.text
    assert sent == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"service_tier": "gold"}, "service_tier", ["Unknown service_tier 'gold'", "batch, interactive, standard", "flex, priority"]),
        ({"service_tier": 3}, "service_tier", ["service_tier"]),
        ({"priority": 3}, "priority", ["priority 3 is out of range: 0 (the highest class) to 2"]),
        ({"priority": -1}, "priority", ["out of range"]),
        ({"priority": "high"}, "priority", ["priority"]),
        ({"priority": 0.5}, "priority", ["priority"]),
        ({"priority": True}, "priority", ["priority"]),
        ({"priority": 0, "service_tier": "flex"}, "priority", ["service_tier selects class 'batch' and priority selects 'interactive'"]),
    ],
)
def test_a_bad_class_field_is_a_400_naming_it(server, fields, param, words):
    response, sent = ask(server, CHAT_KEY, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param or param in error["message"]
    for word in words:
        assert word in error["message"]
    assert sent == []  # nothing reached the engine


def test_a_class_the_key_may_not_use_is_a_403_naming_the_class_never_the_key(server):
    response, sent = ask(server, NIGHTLY_KEY, service_tier="priority")
    assert response.status_code == 403
    error = response.json()["error"]
    assert "'interactive'" in error["message"] and "batch, standard" in error["message"]
    assert NIGHTLY_KEY not in json.dumps(response.json()) and "nightly" not in error["message"]
    assert sent == []


def test_without_classes_only_what_asks_for_nothing_passes():
    app = create_app(ServerSettings("127.0.0.1:1", MODEL), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    with TestClient(app) as client:
        app.state.triton = triton = FakeTriton(echo_words)
        for fields in ({"service_tier": "auto"}, {"service_tier": "default"}, {"priority": 0}, {}):
            assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1, **fields}).status_code == 200
        assert [request.priority for request in triton.requests] == [None] * 4  # no class: no priority sent
        for fields, param in (({"service_tier": "priority"}, "service_tier"), ({"priority": 1}, "priority")):
            response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1, **fields})
            assert response.status_code == 400 and response.json()["error"]["param"] == param
            assert "no traffic classes" in response.json()["error"]["message"]


def test_a_model_without_a_priority_input_gets_the_class_but_no_priority():
    model = dataclasses.replace(MODEL, traffic=table({**SPEC, "keys": {}}), takes_priority=False)  # the engine target's
    app = create_app(ServerSettings("127.0.0.1:1", model), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    with TestClient(app) as client:
        app.state.triton = triton = FakeTriton(echo_words)
        assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1, "service_tier": "priority"}).status_code == 200
        assert triton.requests[0].priority is None


def test_key_names_the_table_maps_must_exist_at_start():
    model = dataclasses.replace(MODEL, traffic=table())
    with pytest.raises(TrafficTableError, match="serve.traffic.keys names 'chat-app', 'nightly', which no API key of this server has"):
        ServerSettings("127.0.0.1:1", model, access=AccessPolicy(KeyRing((ApiKey("ops", "ops-secret-0123456789abc"),))))
    with pytest.raises(TrafficTableError, match="but this server has no API keys"):
        ServerSettings("127.0.0.1:1", model)


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "not a traffic-class table"),
        (json.dumps({"classes": [{"name": "a", "priority": 2}], "default_class": "a"}), "priority 2.0 is not in"),
        (json.dumps({"classes": [{"name": "a", "priority": 1}], "default_class": "b"}), "names class 'b', which it does not define"),
        (json.dumps({"classes": [{"name": "a"}], "default_class": "a"}), "not a traffic-class table"),
    ],
)
def test_a_hand_edited_table_stops_the_front_end_at_start(text, words):
    with pytest.raises(TrafficTableError, match=words):
        TrafficTable.from_json(text, "preprocessing")


def test_the_table_travels_in_the_preprocessing_parameters():
    parameters = {
        "tokenizer_dir": str(TOKENIZER_DIR),
        "max_input_len": "48",
        "max_seq_len": "64",
        **traffic_parameters(ServeSpec(traffic=TrafficSpec.model_validate(SPEC))),
    }
    model = ServedModel.from_parameters(parameters, name="tiny", triton_model="ensemble", source="test", takes_priority=True)
    assert model.traffic is not None and model.traffic.names == ("batch", "interactive", "standard")
    assert [c.name for c in model.traffic.ranked] == ["interactive", "standard", "batch"]


def test_metrics_carry_the_class_and_count_its_objectives(server):
    client, _ = server
    ask(server, CHAT_KEY, max_tokens=3)  # interactive: a 500 ms TTFT objective, met by the scripted Triton
    ask(server, NIGHTLY_KEY, max_tokens=3)  # batch: no objectives, so met
    text = client.get("/metrics", headers={"Authorization": f"Bearer {CHAT_KEY}"}).text
    assert 'trtllm_pipeline_openai_time_to_first_token_seconds_count{class="interactive"}' in text
    assert 'trtllm_pipeline_openai_inter_token_latency_seconds_count{class="batch"}' in text
    counts = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("trtllm_pipeline_openai_slo_choices_total{")
    }
    assert counts.get('trtllm_pipeline_openai_slo_choices_total{class="interactive",slo="met"}', 0) >= 1
    assert counts.get('trtllm_pipeline_openai_slo_choices_total{class="batch",slo="met"}', 0) >= 1


def test_a_missed_objective_is_counted_missed():
    from clients.openai_server.metrics import FrontEndMetrics
    from clients.openai_server.traffic import TrafficClass

    metrics = FrontEndMetrics(classed=True)
    tight = TrafficClass("interactive", 1.0, ttft_slo_ms=100, tpot_slo_ms=10)
    metrics.observe_choice(tight, ttft_s=0.05, tpot_s=0.005)
    metrics.observe_choice(tight, ttft_s=0.2, tpot_s=0.005)  # late first token
    metrics.observe_choice(tight, ttft_s=0.05, tpot_s=0.02)  # slow tokens
    text = metrics.exposition()
    assert 'trtllm_pipeline_openai_slo_choices_total{class="interactive",slo="met"} 1.0' in text
    assert 'trtllm_pipeline_openai_slo_choices_total{class="interactive",slo="missed"} 2.0' in text

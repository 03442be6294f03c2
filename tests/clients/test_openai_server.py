"""The OpenAI-compatible front end without Triton: schemas, error shapes, templating, stop handling,
planning (model, n, context, sampling), the choice runner, and the app over a scripted Triton client.

The real server against the real tritonserver is tests/integration/test_openai_server.py.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from tritonclient.utils import deserialize_bytes_tensor

from clients.errors import ClientTimeoutError, RequestError, ServerUnavailableError
from clients.openai_server import ServedModel, ServerSettings, create_app
from clients.openai_server.errors import OpenAIError, from_client_error, from_validation_error
from clients.openai_server.generation import ChoicePlan, Route, collect, merged, run_choice
from clients.openai_server.llm_path import LLMChunk
from clients.openai_server.planning import Context, plan_chat, plan_completion
from clients.openai_server.runner import base_url
from clients.openai_server.schemas import ChatCompletionRequest, CompletionRequest
from clients.openai_server.stops import StopMatcher
from clients.openai_server.templating import chat_prompt, plain_chat_prompt
from clients.openai_server.tokenizer import PromptTokenizer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "models" / "tiny-stdlib-llama"
PACKAGE = REPO / "clients" / "openai_server"
MODEL = ServedModel(name="tiny", tokenizer_dir=TOKENIZER_DIR, max_seq_len=64, max_input_len=48)


@pytest.fixture(scope="module")
def tokenizer() -> PromptTokenizer:
    return PromptTokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def context(tokenizer) -> Context:
    return Context(MODEL, tokenizer, max_n=4)


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps({"model": "tiny", "prompt": "def f(x):", **fields}))


def chat(**fields) -> ChatCompletionRequest:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body))


def refusal(call) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        call()
    return raised.value


# -- schemas and error shapes -----------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"n": "2"}, "n", "invalid_type"),
        ({"max_tokens": True}, "max_tokens", "invalid_type"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"stop": [1]}, "stop", "invalid_value"),
        ({"prompt": [1, -2, 3]}, "prompt", "invalid_value"),
        ({"prompt": []}, "prompt", "invalid_value"),
        ({"prompt": [[1, 2], []]}, "prompt", "invalid_value"),
        ({"prompt": [1, "a"]}, "prompt", "invalid_value"),
        ({"logprobs": 6}, "logprobs", "invalid_value"),
        ({"prompt": None}, "prompt", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "invalid_type"),
        ({"temprature": 0.5}, "temprature", "unknown_parameter"),
        ({"use_beam_search": True}, "use_beam_search", "unknown_parameter"),  # vLLM's beam flag: not served here (#15)
    ],
)
def test_wrong_types_and_values_are_named_400s(fields, param, code):
    with pytest.raises(ValidationError) as raised:
        completion(**fields)
    error = from_validation_error(raised.value)
    assert (error.status, error.param, error.code, error.type) == (400, param, code, "invalid_request_error")
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_missing_model_or_messages_is_missing_required_parameter():
    for schema, body, param in ((CompletionRequest, {"prompt": "x"}, "model"), (ChatCompletionRequest, {"model": "tiny"}, "messages")):
        with pytest.raises(ValidationError) as raised:
            schema.model_validate_json(json.dumps(body))
        error = from_validation_error(raised.value)
        assert error.body() == {
            "error": {
                "message": f"Missing required parameter: '{param}'.",
                "type": "invalid_request_error",
                "param": param,
                "code": "missing_required_parameter",
            }
        }


def test_chat_content_may_be_text_parts_only():
    request = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert request.messages[0].text() == "ab"
    with pytest.raises(ValidationError, match="'image_url' are not supported"):
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


@pytest.mark.parametrize(
    "error, status, code",
    [
        (ServerUnavailableError("127.0.0.1:1", "connection refused"), 503, "triton_unavailable"),
        (ClientTimeoutError(5.0), 504, "timeout"),
        (RequestError(None, "in ensemble 'ensemble', max_tokens 5000 is more than the engine can generate"), 400, None),
        (RequestError("INVALID_ARGUMENT", "bad input"), 400, None),
        (RequestError("NOT_FOUND", "Request for unknown model"), 503, "triton_unavailable"),
        (RequestError("INTERNAL", "boom"), 500, None),
        # a dead Python-backend stub, as Triton 2.51 streams it (no status): the server's fault, not the client's
        (RequestError(None, "in ensemble 'ensemble', Stub process 'preprocessing_0_0' is not healthy."), 503, "triton_unavailable"),
    ],
)
def test_triton_errors_map_to_statuses(error, status, code):
    mapped = from_client_error(error)
    assert (mapped.status, mapped.code) == (status, code)
    if status == 400 and error.status is None:
        assert mapped.message == "max_tokens 5000 is more than the engine can generate"  # Triton's ensemble prefix dropped


# -- templating ----------------------------------------------------------------------------------
def test_plain_chat_template_is_the_documented_one(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    expected = "Be brief.\n\nUser: hi\nAssistant: hello\nUser: bye\nAssistant:"
    assert plain_chat_prompt(messages) == expected
    assert not tokenizer.has_chat_template and chat_prompt(messages, tokenizer) == expected


def test_the_tokenizers_chat_template_is_used_without_a_second_bos(tmp_path):
    directory = shutil.copytree(TOKENIZER_DIR, tmp_path / "tok", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with_template = PromptTokenizer(directory)
    assert with_template.has_chat_template and with_template.adds_bos
    assert chat_prompt([{"role": "user", "content": "hi"}], with_template) == "<user>hi\n<assistant>"
    assert with_template.count("<user>hi") == PromptTokenizer(TOKENIZER_DIR).count("<user>hi")


def test_prompt_tokens_are_counted_like_the_preprocessing_model(tokenizer):
    sys.path.insert(0, str(REPO / "model_repo" / "python"))
    try:
        from hf_tokenizer import HFTokenizer
    finally:
        sys.path.remove(str(REPO / "model_repo" / "python"))
    served = HFTokenizer(TOKENIZER_DIR)
    for text in ("def f(x):", "User: hi\nAssistant:", "é日本 \n\t  x"):
        assert tokenizer.encode(text) == served.encode(text, add_special_tokens=True)


# -- stop sequences -----------------------------------------------------------------------------------
def feed(stops, deltas):
    matcher = StopMatcher(stops)
    out = []
    for delta in deltas:
        text, stopped = matcher.push(delta)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_stop_sequence_split_across_deltas_is_held_back_and_removed():
    assert feed(["\n\n"], ["a\n", "\nb"]) == (["a", ""], True)
    assert feed(["END"], ["xE", "N", "D tail"]) == (["x", "", ""], True)


def test_a_partial_match_that_does_not_complete_is_released():
    assert feed(["END"], ["xE", "Ny", "z"]) == (["x", "ENy", "z", ""], False)
    assert feed(["abc"], ["ab"]) == ([""] + ["ab"], False)  # released at the end


def test_the_earliest_of_several_stops_wins_and_no_stops_passes_through():
    assert feed(["b", "cd"], ["xcdab"]) == (["x"], True)
    assert feed([], ["a", "b"]) == (["a", "b", ""], False)
    with pytest.raises(ValueError):
        StopMatcher([""])


# -- planning ---------------------------------------------------------------------------------------
def test_unknown_model_is_404_model_not_found(context):
    error = refusal(lambda: plan_completion(completion(model="gpt-4"), context))
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")


def test_max_tokens_defaults_and_context_limits(context, tokenizer):
    prompt_tokens = tokenizer.count("def f(x):")
    assert plan_completion(completion(), context).choices[0].max_tokens == 16
    assert plan_completion(completion(max_tokens=None), context).choices[0].max_tokens == 64 - prompt_tokens
    assert plan_chat(chat(), context).choices[0].max_tokens == 64 - tokenizer.count("User: hi\nAssistant:")
    assert plan_chat(chat(max_completion_tokens=3), context).choices[0].max_tokens == 3
    for value in (0, -1):
        assert refusal(lambda value=value: plan_completion(completion(max_tokens=value), context)).param == "max_tokens"
    too_many = refusal(lambda: plan_completion(completion(max_tokens=64), context))
    assert (too_many.code, too_many.param) == ("context_length_exceeded", "max_tokens")
    assert f"{prompt_tokens}-token prompt" in too_many.message
    long_prompt = refusal(lambda: plan_completion(completion(prompt="x = 1\n" * 40), context))
    assert (long_prompt.code, long_prompt.param) == ("context_length_exceeded", "prompt")


def test_n_prompts_and_seeds(context):
    plan = plan_completion(completion(prompt=["a", "b"], n=2, seed=2**64 - 1, temperature=0.7), context)
    assert [(c.index, c.prompt, c.sampling["seed"]) for c in plan.choices] == [(0, "a", 2**64 - 1), (1, "a", 0), (2, "b", 2**64 - 1), (3, "b", 0)]
    assert plan.prompt_tokens == 4  # each prompt once: BOS + one token each
    assert plan.choices[0].sampling == {"temperature": 0.7, "top_p": 1.0, "seed": 2**64 - 1}
    error = refusal(lambda: plan_completion(completion(n=5), context))
    assert (error.status, error.param) == (400, "n") and "at most 4" in error.message


def test_greedy_sends_only_temperature_zero_and_extensions_pass_through(context):
    plan = plan_completion(completion(temperature=0, top_p=0.5, top_k=3, min_tokens=2, repetition_penalty=1.1, stop="\n"), context)
    [choice] = plan.choices
    assert choice.sampling == {"temperature": 0, "min_tokens": 2, "repetition_penalty": 1.1}
    assert choice.stop == ("\n",) and choice.request().inputs(stream=True)["stop_words"] == ["\n"]
    assert plan_chat(chat(), context).choices[0].sampling == {"temperature": 1.0, "top_p": 1.0}  # OpenAI's default: sampling


@pytest.mark.parametrize(
    "make, param",
    [
        (lambda: completion(logprobs=1), "logprobs"),
        (lambda: completion(logprobs=0, echo=True), "echo"),
        (lambda: completion(suffix="x"), "suffix"),
        (lambda: completion(best_of=3), "best_of"),
        (lambda: chat(logprobs=True, top_logprobs=2), "top_logprobs"),
        (lambda: chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (lambda: chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]), "messages.0.role"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_with_the_reason(context, make, param):
    request = make()
    plan = plan_chat if isinstance(request, ChatCompletionRequest) else plan_completion
    error = refusal(lambda: plan(request, context))
    assert (error.status, error.param, error.code) == (400, param, "unsupported_parameter")


@pytest.mark.parametrize("bias", [{"x": 5}, {"-1": 5}, {"4096": 5}, {"7": 101}, {"7": -100.5}])
def test_a_logit_bias_outside_the_vocabulary_or_range_is_a_400_naming_it(context, bias):
    error = refusal(lambda: plan_completion(completion(logit_bias=bias), context))
    assert (error.status, error.param, error.code) == (400, "logit_bias", "invalid_value")


def test_logit_bias_goes_to_the_llm_model_as_its_embedding_bias(tokenizer):
    app = create_app(ServerSettings("127.0.0.1:1", MODEL), tokenizer=tokenizer)
    with TestClient(app) as client:
        app.state.triton = triton = FakeTriton(echo_words)
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logit_bias": {"42": -100, "7": 3.5, "9": 0}},
        )
        assert answer.status_code == 200, answer.text
        row = triton.calls[-1].values["embedding_bias"]
        assert row.shape == (tokenizer.vocab_size,) and row[42] == -100 and row[7] == 3.5 and row.sum() == -96.5


def test_stream_options_need_stream_and_logprobs_zero_is_served(context):
    assert refusal(lambda: plan_completion(completion(stream_options={"include_usage": True}), context)).param == "stream_options"
    assert plan_completion(completion(logprobs=0), context).logprobs
    assert plan_completion(completion(stream=True, stream_options={"include_usage": True}), context).include_usage


# -- running choices against a scripted Triton client ------------------------------------------------------
class FakeStream:
    """What the app uses of AsyncTextStream: text deltas, tokens_received, log_probs_received, cancel()."""

    def __init__(self, responses, error=None):
        self._responses = responses  # (text, [log-prob per token]) per Triton response
        self._error = error
        self._tokens: list[float] = []
        self.cancelled = False

    def __aiter__(self):
        return self._deltas()

    async def _deltas(self):
        for text, log_probs in self._responses:
            await asyncio.sleep(0)
            if self.cancelled:
                return
            self._tokens += log_probs
            if text:
                yield text
        if self._error is not None:
            raise self._error

    @property
    def tokens_received(self):
        return len(self._tokens)

    @property
    def log_probs_received(self):
        return tuple(self._tokens)

    def cancel(self):
        self.cancelled = True


class FakeLLMCall:
    """What llm_path uses of a direct call to the LLM model: chunks() and cancel(). Answers token 42,
    one response per token, with logits (one-hot on token 42) where the request asked for them."""

    VOCAB = 64

    def __init__(self, inputs, outputs):
        self.values = {tensor.name(): _fake_values(tensor) for tensor in inputs}
        self.outputs = [output.name() for output in outputs]
        self.cancelled = False

    async def chunks(self):
        logits = np.full((1, self.VOCAB), -10.0, dtype=np.float32)
        logits[0, 42] = 10.0
        prompt = len(self.values["input_ids"])
        count = int(self.values["request_output_len"][0])
        for position in range(count):
            await asyncio.sleep(0)
            if self.cancelled:
                return
            context = np.repeat(logits, prompt, axis=0) if position == 0 and "context_logits" in self.outputs else None
            generation = logits if "generation_logits" in self.outputs else None
            yield LLMChunk(position == count - 1, (42,), (-0.25,), context, generation)

    def cancel(self):
        self.cancelled = True


_FAKE_DTYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


def _fake_values(tensor) -> np.ndarray:
    if tensor.datatype() == "BYTES":  # e.g. a guide (guided_grammar with a token-id prompt goes to the LLM model)
        return deserialize_bytes_tensor(tensor._raw_content)
    return np.frombuffer(tensor._raw_content, dtype=_FAKE_DTYPES[tensor.datatype()])


class FakeTriton:
    url = "127.0.0.1:1"

    def __init__(self, script):
        self.script = script  # GenerationRequest -> FakeStream
        self.requests, self.streams = [], []
        self.calls: list[FakeLLMCall] = []  # direct calls to the LLM model

    def model_stream(self, model, inputs, outputs, parse):
        self.calls.append(FakeLLMCall(inputs, outputs))
        return self.calls[-1]

    def stream_request(self, request):
        self.requests.append(request)
        self.streams.append(self.script(request))
        return self.streams[-1]

    async def is_ready(self):
        return True

    async def close(self):
        pass


def run(events):
    async def gather():
        return [event async for event in events]

    return asyncio.run(gather())


def test_a_choice_ends_before_its_stop_sequence_and_cancels_its_request():
    triton = FakeTriton(lambda request: FakeStream([("a", [-1.0]), ("\n", [-2.0]), ("\nb", [-3.0]), ("c", [-4.0])]))
    events = run(run_choice(Route(triton), ChoicePlan(0, "p", 10, stop=("\n\n",), logprobs=True)))
    assert "".join(e.text for e in events) == "a" and events[-1].finish_reason == "stop"
    assert events[-1].completion_tokens == 3 and triton.streams[0].cancelled
    assert [(lp.token, lp.logprob, lp.offset) for e in events for lp in e.logprobs] == [("a", -1.0, 0)]


def test_finish_reason_tokens_and_logprobs_of_a_whole_choice():
    responses = [("", [-0.5]), ("é", [-0.25]), ("x", [-1.0]), ("", [])]  # a token completing no character, then é
    triton = FakeTriton(lambda request: FakeStream(responses))
    [result] = asyncio.run(collect(run_choice(Route(triton), ChoicePlan(0, "p", 3, logprobs=True)), 1))
    assert (result.text, result.finish_reason, result.completion_tokens) == ("éx", "length", 3)
    assert [(lp.token, lp.offset) for lp in result.logprobs] == [("", 0), ("é", 0), ("x", 1)]
    [short] = asyncio.run(collect(run_choice(Route(triton), ChoicePlan(0, "p", 8)), 1))
    assert short.finish_reason == "stop" and short.logprobs == []  # ended (end token) before max_tokens
    assert triton.requests[0].return_log_probs  # always: the token counts come from them


def test_a_choice_cancelled_from_outside_is_an_error_not_a_short_answer():
    stream = FakeStream([("a", [-1.0])] * 5)
    triton = FakeTriton(lambda request: stream)

    async def scenario():
        events = run_choice(Route(triton), ChoicePlan(0, "p", 10))
        first = await anext(events)
        stream.cancel()  # e.g. the server shutting down
        with pytest.raises(ServerUnavailableError, match="cancelled"):
            await anext(events)
        return first

    assert asyncio.run(scenario()).text == "a"


def test_merged_choices_interleave_and_an_error_cancels_the_others():
    scripts = iter([FakeStream([("a", [-1.0])] * 3), FakeStream([("b", [-1.0])], error=RequestError(None, "boom")), FakeStream([("c", [-1.0])] * 50)])
    triton = FakeTriton(lambda request: next(scripts))
    plans = [ChoicePlan(index, "p", 60) for index in range(3)]
    with pytest.raises(RequestError, match="boom"):
        run(merged(Route(triton), plans))
    assert triton.streams[2].cancelled
    triton = FakeTriton(lambda request: FakeStream([(request.prompt, [-1.0])]))
    results = asyncio.run(collect(merged(Route(triton), [ChoicePlan(i, str(i), 5) for i in range(3)]), 3))
    assert [r.text for r in results] == ["0", "1", "2"]


# -- the app ------------------------------------------------------------------------------------------------
@pytest.fixture
def app_client(tokenizer):
    def make(script, **settings):
        app = create_app(ServerSettings("127.0.0.1:1", MODEL, **settings), tokenizer=tokenizer)
        client = TestClient(app)
        client.__enter__()
        app.state.triton = FakeTriton(script)
        made.append(client)
        return client, app.state.triton

    made = []
    yield make
    for client in made:
        client.__exit__(None, None, None)


def echo_words(request):
    return FakeStream([(" w", [-0.5])] * request.max_tokens)


def sse_events(text: str) -> list:
    lines = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_and_chat_bodies(app_client):
    client, triton = app_client(echo_words)
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2, "temperature": 0}).json()
    assert body["object"] == "text_completion" and body["choices"] == [{"index": 0, "text": " w w", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    body = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "n": 2}).json()
    assert [c["message"] for c in body["choices"]] == [{"role": "assistant", "content": " w", "refusal": None}] * 2
    assert body["usage"]["completion_tokens"] == 2 and triton.requests[-1].prompt == "User: x\nAssistant:"
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert client.get("/v1/models/other").status_code == 404


def test_chat_stream_has_role_content_finish_usage_and_done(app_client, tokenizer):
    client, _ = app_client(echo_words)
    prompt_tokens = tokenizer.count("User: x\nAssistant:")
    response = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [e["choices"][0]["delta"] if e["choices"] else None for e in events] == [
        {"role": "assistant", "content": ""},
        {"content": " w"},
        {"content": " w"},
        {},
        None,
    ]
    assert events[3]["choices"][0]["finish_reason"] == "length" and all(e["usage"] is None for e in events[:-1])
    assert events[-1]["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2}


def test_completion_stream_without_usage_has_no_usage_field(app_client):
    client, _ = app_client(echo_words)
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True})
    events = sse_events(response.text)
    assert [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in events] == [(" w", None), (" w", None), ("", "length")]
    refused = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True, "echo": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"
    assert not any("usage" in event for event in events)


def test_errors_before_the_stream_keep_their_status_and_after_it_go_into_it(app_client):
    client, _ = app_client(lambda request: FakeStream([], error=ServerUnavailableError("127.0.0.1:1", "refused")))
    for stream in (False, True):
        response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": stream})
        assert response.status_code == 503 and response.json()["error"]["code"] == "triton_unavailable"
    client, _ = app_client(lambda request: FakeStream([(" a", [-1.0])], error=RequestError(None, "in ensemble 'e', late")))
    events = sse_events(client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": True}).text)
    assert events[-1] == {"error": {"message": "late", "type": "invalid_request_error", "param": None, "code": None}}


def test_malformed_bodies_and_the_size_limit(app_client):
    client, _ = app_client(echo_words, max_body_bytes=100)
    cases = [
        (b"{", 400, "invalid_json"),
        (b"[1]", 400, "invalid_json"),
        (b'{"model": "tiny"}', 400, "missing_required_parameter"),
        (json.dumps({"model": "tiny", "prompt": "x" * 200}).encode(), 413, "request_too_large"),
    ]
    for body, status, code in cases:
        response = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), body
    assert client.get("/v2/whatever").json()["error"]["code"] == "unknown_url"
    assert client.get("/v1/completions").status_code == 405
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}).status_code == 200  # still serving


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


TOO_DEEP = "the JSON body nests deeper than 64 levels"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_nesting_deeper_than_the_limit_is_a_400_naming_it(app_client, path):
    client, triton = app_client(echo_words)
    nested = b"[" * 100_000 + b"]" * 100_000  # ~200 KB: json.loads alone would end in a RecursionError (a 500)
    value = b'{"model": "tiny", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "user": ' + nested + b"}"
    for body in (b"[" * 100_000, nested, value, b'{"a": ' * 50_000):
        error = error_of(client.post(path, content=body), 400)
        assert (error["code"], error["type"]) == ("json_too_deep", "invalid_request_error") and TOO_DEEP in error["message"]
    assert not triton.requests
    # 64 levels pass (the next check refuses the value); brackets inside strings do not count
    deepest = b'{"model": "tiny", "prompt": "x", "user": ' + b"[" * 63 + b"]" * 63 + b"}"
    assert error_of(client.post(path, content=deepest), 400)["code"] in ("invalid_type", "missing_required_parameter")
    in_text = json.dumps({"model": "tiny", "prompt": "x", "user": "[" * 10_000 + '\\"{' * 100, "max_tokens": 1}).encode()
    assert client.post("/v1/completions", content=in_text).status_code == 200


def test_the_nesting_limit_is_a_setting(app_client):
    client, _ = app_client(echo_words, max_json_depth=2)
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": ["x"], "max_tokens": 1}).status_code == 200  # 2 deep
    error = error_of(client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stop": [["x"]]}), 400)
    assert error["code"] == "json_too_deep" and "deeper than 2 levels" in error["message"]
    with pytest.raises(ValueError, match="max_json_depth"):
        ServerSettings("127.0.0.1:1", MODEL, max_json_depth=0)


@pytest.mark.parametrize(
    "body, deeper_than_2",
    [
        (b'{"a": [1]}', False),
        (b'{"a": [[1]]}', True),
        (b'[{"a": "[[[["}]', False),  # brackets in a string
        (b'["\\"[[[[", "\\\\", "[[[["]', False),  # an escaped quote, an escaped backslash
        (b'["\\\\"[[]]]', True),  # the string ends after the escaped backslash
        (b"[[1],[2],[3],[{}]]", True),
        (b"[[1],[2],[3],[4]]", False),
        (b'["[[[[', False),  # an unterminated string hides the rest, as a parser stops there
        (b"[[[", True),  # unterminated, but a parser would still go 3 deep before finding out
        (b"]]]][[[", False),  # a parser stops at the first ]
    ],
)
def test_the_nesting_scan(body, deeper_than_2):
    from clients.openai_server.bodies import nests_deeper_than

    assert nests_deeper_than(body, 2) is deeper_than_2
    with contextlib.suppress(json.JSONDecodeError):
        assert (max_depth(json.loads(body)) > 2) is deeper_than_2


def max_depth(value) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max((max_depth(child) for child in children), default=0)


def test_the_nesting_scan_of_a_whole_mebibyte_is_cheap():
    from clients.openai_server.bodies import nests_deeper_than

    wide = b"[" + b"[1]," * 262_000 + b"[1]]"
    started = time.perf_counter()
    assert not nests_deeper_than(wide, 64) and nests_deeper_than(b"[" * (1 << 20), 64)
    assert not nests_deeper_than(b"[" + b"[" * 62 + b"[[1]]" * 200_000 + b"]" * 63, 65)
    # ~0.1 s here; the bound is generous for a loaded machine and still far under what a scan that is quadratic in
    # the body (~10**12 steps for a mebibyte) would take
    assert time.perf_counter() - started < 60.0


def test_the_size_limit_is_exact_whether_declared_or_streamed(app_client):
    limit = 200
    client, _ = app_client(echo_words, max_body_bytes=limit)

    def body(size: int) -> bytes:
        start = b'{"model": "tiny", "max_tokens": 1, "prompt": "x", "user": "'
        return start + b"x" * (size - len(start) - 2) + b'"}'

    for send in (
        lambda data: client.post("/v1/completions", content=data),  # Content-Length
        lambda data: client.post("/v1/completions", content=iter([data[:50], data[50:]])),
    ):  # chunked, no length
        assert send(body(limit)).status_code == 200
        error = error_of(send(body(limit + 1)), 413)
        assert error["code"] == "request_too_large" and f"limit of {limit} bytes" in error["message"]


@pytest.mark.parametrize(
    "body, says",
    [
        (b"model=tiny&prompt=x", "We could not parse the JSON body of your request: Expecting value"),
        (b'{"model": "tiny", "prompt": "\xff"}', "it is not UTF-8"),
        ('{"model": "tiny"}'.encode("utf-16"), "it is not UTF-8"),
        (b'{"model": "tiny", "prompt": "\\ud800"}', "We could not parse the JSON body of your request: Invalid JSON"),  # a lone surrogate
        (b'"just a string"', "must be a JSON object, not str"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_a_400(app_client, body, says):
    client, _ = app_client(echo_words)
    error = error_of(client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"}), 400)
    assert error["code"] == "invalid_json" and says in error["message"] and error["param"] is None


def test_whole_numbers_with_a_fraction_are_integers_as_in_json_schema(app_client):
    """Found by Schemathesis: JSON Schema's integer includes 2.0, which strict pydantic refused."""
    client, triton = app_client(echo_words)
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2.0, "n": 2.0, "seed": 7.0, "temperature": 0.5})
    assert response.status_code == 200 and len(response.json()["choices"]) == 2
    assert (triton.requests[-1].max_tokens, triton.requests[-1].seed) == (2, 8)
    for fields, param in (({"n": 2.5}, "n"), ({"max_tokens": True}, "max_tokens"), ({"seed": 1e300}, "seed")):
        assert error_of(client.post("/v1/completions", json={"model": "tiny", "prompt": "x", **fields}), 400)["param"] == param


def test_a_wrong_method_is_a_405_with_allow_in_openais_shape(app_client):
    """Found by Schemathesis: the 405 lost Starlette's Allow header."""
    client, _ = app_client(echo_words)
    response = client.put("/v1/chat/completions", json={})
    error = error_of(response, 405)
    assert response.headers["allow"] == "POST" and error["code"] == "method_not_allowed"
    assert client.delete("/v1/models").headers["allow"] == "GET"


def test_openapi_documents_every_body_and_answer(app_client):
    from jsonschema import Draft202012Validator

    client, _ = app_client(echo_words)
    document = client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    assert "HTTPValidationError" not in components and "422" not in json.dumps(document["paths"])
    expected = {
        ("/v1/completions", "post"): (400, 404, 413, 503),
        ("/v1/chat/completions", "post"): (400, 404, 413, 503),
        ("/v1/models/{model_id}", "get"): (404,),
        ("/health", "get"): (503,),
        ("/v1/models", "get"): (),
    }
    for (path, method), statuses in expected.items():
        operation = document["paths"][path][method]
        assert "200" in operation["responses"]
        for status in statuses:
            assert operation["responses"][str(status)]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    body = {"$ref": "#/components/schemas/ChatCompletionRequest"}
    assert document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"] == body
    assert "text/event-stream" in document["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    validator = Draft202012Validator({**body, "components": document["components"]})
    validator.validate({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 2, "stop": ["\n"]})
    for refused in (
        {"model": "gpt-4", "messages": [{"role": "user"}]},
        {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]},
        {"model": "tiny", "messages": [{"role": "user"}], "n": 9},
        {"model": "tiny", "messages": [{"role": "user"}], "tools": [{}]},
        {"model": "tiny", "messages": []},
        {"model": "tiny", "messages": [{"role": "user"}], "temprature": 1},
    ):
        assert not validator.is_valid(refused), refused
        assert client.post("/v1/chat/completions", json=refused).status_code in (400, 404)  # what it documents, it refuses


# -- what the server needs of the clients library ---------------------------------------------------------------
class FakeResult:
    def __init__(self, text, log_probs, final):
        import numpy as np
        from tritonclient.grpc import service_pb2

        self._arrays = {"text_output": np.array([[text.encode()]], dtype=object), "output_log_probs": np.array([[log_probs]], dtype=np.float32)}
        self._response = service_pb2.ModelInferResponse()
        self._response.parameters["triton_final_response"].bool_param = final

    def get_response(self):
        return self._response

    def as_numpy(self, name):
        return self._arrays.get(name)


class FakeCall:
    """tritonclient.grpc.aio's response iterator: (result, error) pairs, then the end of the RPC."""

    def __init__(self, results):
        self._results = list(results)
        self.read_to_end = self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._results:
            self.read_to_end = True
            raise StopAsyncIteration
        return self._results.pop(0), None

    def cancel(self):
        self.cancelled = True


def test_responses_carry_their_tokens_log_probs():
    from clients.grpc import chunk_from_result
    from clients.types import chunk_from_json

    assert chunk_from_json({"text_output": "ab", "output_log_probs": [[-1.0, -2.0]]}).log_probs == (-1.0, -2.0)
    chunk = chunk_from_result(FakeResult("a", [-0.5], final=True))
    assert (chunk.text, chunk.num_tokens, chunk.log_probs, chunk.final) == ("a", 1, (-0.5,), True)


def test_an_aio_grpc_call_is_read_to_its_end_and_not_cancelled_after_its_final_response():
    """Cancelling a call between its final response and its end leaves Triton 2.51's ensemble unable to unload."""
    from clients.aio_transport import AioGrpcCall

    class Client:
        def __init__(self, call):
            self.call = call

        def stream_infer(self, requests, stream_timeout=None):
            return self.call

    async def scenario(stop_early):
        call = FakeCall([FakeResult("a", [-1.0], final=False), FakeResult("b", [-2.0], final=True)])
        grpc_call = AioGrpcCall(Client(call), "url", "ensemble", {"text_input": "x", "max_tokens": 2}, timeout=None)
        chunks = grpc_call.chunks()
        texts = []
        async for chunk in chunks:
            texts.append(chunk.text)
            if stop_early and chunk.final:
                grpc_call.cancel()  # e.g. a stop sequence found in the last response
                break
        await chunks.aclose()
        grpc_call.close()
        return texts, call

    texts, call = asyncio.run(scenario(stop_early=False))
    assert texts == ["a", "b"] and call.read_to_end and not call.cancelled
    texts, call = asyncio.run(scenario(stop_early=True))
    assert texts == ["a", "b"] and not call.cancelled


# -- package rules ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_package_imports_only_clients_and_stays_small(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {name for name in imported if name.split(".")[0] in ("pipeline", "refengine")}
    assert len(path.read_text().splitlines()) < 300


def test_base_url_is_what_a_local_client_uses():
    assert base_url("0.0.0.0", 9000) == "http://127.0.0.1:9000/v1"
    assert base_url("::", 9) == "http://[::1]:9/v1" and base_url("10.0.0.2", 1) == "http://10.0.0.2:1/v1"


# -- direct choices: token ids, prompt log-probs, alternatives (llm_path) ---------------------------------------------
LOGITS_MODEL = ServedModel(name="tiny", tokenizer_dir=TOKENIZER_DIR, max_seq_len=64, max_input_len=48, context_logits=True, generation_logits=True)


def test_echo_with_logprobs_scores_the_prompt_and_max_tokens_0_generates_nothing(tokenizer):
    app = create_app(ServerSettings("127.0.0.1:1", LOGITS_MODEL), tokenizer=tokenizer)
    with TestClient(app) as client:
        app.state.triton = triton = FakeTriton(echo_words)
        body = client.post("/v1/completions", json={"model": "tiny", "prompt": [[1, 5, 9]], "max_tokens": 0, "echo": True, "logprobs": 2}).json()
        [choice] = body["choices"]
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None and len(logprobs["tokens"]) == 3
        # The fake engine's logits are one-hot on token 42: every prompt token after the first is unlikely, 42 is the best.
        assert all(value < -10 for value in logprobs["token_logprobs"][1:])
        assert [list(top)[0] for top in logprobs["top_logprobs"][1:]] == [tokenizer.token_text(42)] * 2
        assert choice["text"] == tokenizer.decode([1, 5, 9]) and body["usage"]["completion_tokens"] == 0
        call = triton.calls[-1]
        assert call.values["input_ids"].tolist() == [1, 5, 9] and call.values["request_output_len"].tolist() == [1]
        assert {"context_logits", "generation_logits"} <= set(call.outputs) and not triton.requests  # the ensemble is not called

        body = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3, "logprobs": 1}).json()
        logprobs = body["choices"][0]["logprobs"]
        assert logprobs["tokens"] == [tokenizer.token_text(42)] * 3 and logprobs["text_offset"] == sorted(logprobs["text_offset"])
        assert triton.calls[-1].values["input_ids"].tolist() == tokenizer.encode("x")  # encoded as preprocessing does


def test_requests_needing_logits_an_engine_lacks_are_refused_by_name(app_client):
    client, _ = app_client(echo_words)  # MODEL: an engine built without gather_context_logits / gather_generation_logits
    for body, param in (
        ({"prompt": "x", "echo": True, "logprobs": 0}, "echo"),
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
    ):
        answer = client.post("/v1/completions", json={"model": "tiny", **body})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    chat = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 2}).status_code == 200  # token ids need no logits


def test_the_listening_socket_turns_nagle_off_for_every_connection():
    """Without TCP_NODELAY the first SSE event waits behind the unacknowledged response headers for the
    client's delayed ACK (~40 ms): AIPerf measured every stream's first token that late (BENCHMARKS.md)."""
    import socket

    from clients.openai_server.runner import _bind

    listener = _bind("127.0.0.1", 0)
    try:
        with socket.create_connection(listener.getsockname()) as _client:
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert accepted.proto == socket.IPPROTO_TCP  # what asyncio checks before it sets TCP_NODELAY itself
    finally:
        listener.close()


def test_the_llm_model_is_read_from_the_served_models_config(tmp_path):
    """Direct choices call the LLM model the repository names: the ensemble's step that takes input_ids, the BLS's
    tensorrt_llm_model_name (here renamed, as in a repository serving several models), else tensorrt_llm."""
    configs = {
        "a-ensemble": 'name: "a-ensemble"\nplatform: "ensemble"\nensemble_scheduling { step [\n'
        '{ model_name: "a-preprocessing" model_version: -1 input_map { key: "QUERY" value: "text_input" } },\n'
        '{ model_name: "a-tensorrt_llm" model_version: -1 input_map { key: "input_ids" value: "_INPUT_ID" } } ] }\n',
        "a-bls": 'name: "a-bls"\nbackend: "python"\nparameters { key: "tensorrt_llm_model_name" value { string_value: "a-tensorrt_llm" } }\n',
        "llm": 'name: "llm"\nbackend: "python"\n',
        "a-preprocessing": 'name: "a-preprocessing"\nbackend: "python"\n'
        + "".join(
            f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
            for key, value in {"tokenizer_dir": TOKENIZER_DIR, "max_input_len": 48, "max_seq_len": 64}.items()
        ),
    }
    for name, text in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    shutil.copytree(tmp_path / "a-preprocessing", tmp_path / "preprocessing")
    served = {name: ServedModel.from_repository(tmp_path, name="a", triton_model=name) for name in ("a-ensemble", "a-bls", "llm")}
    assert {name: model.llm_model for name, model in served.items()} == {"a-ensemble": "a-tensorrt_llm", "a-bls": "a-tensorrt_llm", "llm": "tensorrt_llm"}
    assert served["a-ensemble"].max_input_len == 48


def test_the_preprocessing_model_is_read_from_the_ensemble_or_the_bls():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from clients.openai_server.model import _preprocessing_name

    def config(text: str) -> model_config_pb2.ModelConfig:
        return text_format.Parse(text, model_config_pb2.ModelConfig())

    assert _preprocessing_name(config('ensemble_scheduling { step { model_name: "a-preprocessing" } }')) == "a-preprocessing"
    assert _preprocessing_name(config('parameters { key: "preprocessing_model_name" value { string_value: "b-pre" } }')) == "b-pre"
    assert _preprocessing_name(config('name: "tensorrt_llm_bls"')) == "preprocessing"

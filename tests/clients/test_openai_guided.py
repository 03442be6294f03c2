"""Structured output in the OpenAI front end's planning and the `infer` command's guide options (#16)."""

from __future__ import annotations

import argparse
import json

import pytest

from clients.cli import add_infer_arguments, guide_options
from clients.openai_server.errors import OpenAIError
from clients.openai_server.planning import plan_chat, plan_completion
from tests.clients.test_openai_server import chat, completion, context, tokenizer  # noqa: F401  (fixtures)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "fields, guide_type, guide",
    [
        ({"response_format": {"type": "json_object"}}, "json_schema", '{"type": "object"}'),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}, "json_schema", json.dumps(SCHEMA)),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
        ({"guided_json": '{"type": "array"}'}, "json_schema", '{"type": "array"}'),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_grammar": 'root ::= "a"'}, "ebnf_grammar", 'root ::= "a"'),
    ],
)
def test_each_guide_becomes_tensorrt_llms_two_inputs_for_completions_and_chat(context, fields, guide_type, guide):  # noqa: F811
    for plan in (plan_completion(completion(**fields), context), plan_chat(chat(**fields), context)):
        inputs = plan.choices[0].request().inputs(stream=False)
        assert (inputs["guided_decoding_guide_type"], inputs["guided_decoding_guide"]) == (guide_type, guide)


def test_text_response_format_is_no_guide(context):  # noqa: F811
    inputs = plan_chat(chat(response_format={"type": "text"}), context).choices[0].request().inputs(stream=False)
    assert "guided_decoding_guide_type" not in inputs


@pytest.mark.parametrize(
    "fields, param, message",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type", "response_format 'xml' is not supported"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", 'needs "json_schema"'),
        ({"guided_regex": "a", "guided_grammar": 'root ::= "a"'}, "guided_grammar", "give one guide, not several"),
        ({"guided_regex": "  "}, "guided_regex", "guided_regex is empty"),
    ],
)
def test_bad_guides_are_a_400_naming_the_parameter(context, fields, param, message):  # noqa: F811
    with pytest.raises(OpenAIError) as raised:
        plan_completion(completion(**fields), context)
    assert (raised.value.status, raised.value.param) == (400, param) and message in str(raised.value)


def test_infer_guide_options(tmp_path):
    parser = add_infer_arguments(argparse.ArgumentParser())
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert guide_options(parser.parse_args(["p", "--json-schema", str(schema)])) == {
        "guided_decoding_guide_type": "json_schema",
        "guided_decoding_guide": json.dumps(SCHEMA),
    }
    assert guide_options(parser.parse_args(["p", "--regex", "[0-9]+"]))["guided_decoding_guide_type"] == "regex"
    assert guide_options(parser.parse_args(["p"])) == {}
    with pytest.raises(SystemExit):  # one guide at a time
        parser.parse_args(["p", "--regex", "a", "--json-schema", str(schema)])
    with pytest.raises(OSError):
        guide_options(parser.parse_args(["p", "--grammar", str(tmp_path / "missing.ebnf")]))


def test_a_token_id_prompt_sends_the_guide_to_tensorrt_llm_as_strings(context, tokenizer):  # noqa: F811
    from clients.openai_server.llm_path import llm_request

    plan = plan_completion(completion(prompt=[5, 6, 7], guided_regex="[0-9]+"), context)
    inputs, _ = llm_request(plan.choices[0], tokenizer)
    sent = {tensor.name(): tensor for tensor in inputs}
    assert sent["guided_decoding_guide_type"].datatype() == "BYTES" and sent["guided_decoding_guide"].shape() == [1, 1]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}, "response_format"),
        ({"guided_json": SCHEMA}, "guided_json"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_grammar": 'root ::= ""'}, "guided_grammar"),
    ],
)
def test_tritons_refusal_of_a_guide_names_the_request_field(context, fields, param):  # noqa: F811
    from clients.errors import RequestError
    from clients.openai_server.errors import from_client_error
    from clients.openai_server.guided import in_request_terms

    for plan in (plan_completion(completion(**fields), context), plan_chat(chat(**fields), context)):
        assert plan.guide_param == param
        refused = RequestError("INVALID_ARGUMENT", "in ensemble 'ensemble', guided_decoding_guide: xgrammar cannot compile the guide")
        error = in_request_terms(from_client_error(refused), plan.guide_param)
        assert (error.status, error.param) == (400, param)
        assert error.message == f"{param}: xgrammar cannot compile the guide"
    off = in_request_terms(from_client_error(RequestError("INVALID_ARGUMENT", "guided_decoding_guide_type: guided decoding is off")), param)
    assert off.param == param and off.message == f"{param}: guided decoding is off"
    other = in_request_terms(from_client_error(RequestError("INVALID_ARGUMENT", "max_tokens: too many")), param)
    assert other.param is None and other.message == "max_tokens: too many"


def test_a_request_without_a_guide_has_no_guide_param(context):  # noqa: F811
    assert plan_chat(chat(response_format={"type": "text"}), context).guide_param is None
    assert plan_completion(completion(), context).guide_param is None

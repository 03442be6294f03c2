"""Speculative cpu-target repositories in the real tritonserver: draft-target and Medusa decoding served end to end.

One tritonserver serves both builds (combined_repository.py: models named `draft-<model>` and `medusa-<model>`),
composed the way the cpu build composes build_configs/tiny-cpu-draft-target.yaml and tiny-cpu-medusa.yaml
(speculative_repositories.py). Greedy answers through the ensemble and the BLS equal the non-speculative engine's
(refengine in this process, on the shared build), the perf-metric outputs and the Prometheus counters count drafts
(and Medusa's tree steps, by depth), and the BLS passes the request's num_draft_tokens (0: no drafts; above
max_draft_len: refused) and use_draft_logits on. A Medusa build refuses num_draft_tokens and beams by name.
"""

from __future__ import annotations

import queue
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clients.openai_server import running_openai_server
from pipeline.serve.front_end_route import front_end_triton_model
from tests.integration.test_triton_cpu import client_inputs, http_generate, metric, metrics, stream_infer
from tests.support.combined_repository import combine_repositories, served_name
from tests.support.serving import greedy_reference, infer_inputs, loopback_options, serving_repository
from tests.support.speculative_repositories import build_medusa_repository, build_speculative_repository, medusa_num_heads

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = ["def foo(x):\n    return", "import os\n", "for i in range("]
MAX_TOKENS = 20
DRAFT_FIGURES = ("acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens")
DRAFT_BLS = served_name("draft", "tensorrt_llm_bls")
MEDUSA_ENSEMBLE = served_name("medusa", "ensemble")
MEDUSA_LLM = served_name("medusa", "tensorrt_llm")


@pytest.fixture(scope="module")
def repository(tiny_cpu, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("speculative")
    builds = {"draft": build_speculative_repository(tiny_cpu, work / "draft"), "medusa": build_medusa_repository(tiny_cpu, work / "medusa")}
    return combine_repositories(builds, work / "model_repository")


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    # the OpenAI front end's route may be the BLS: Triton 2.51 may keep it loaded at stop (serving.STUCK_BLS), a warning
    with serving_repository(repository, tmp_path_factory.mktemp("serve-speculative"), allow_stuck_bls=True) as triton:
        yield triton


@pytest.fixture(scope="module")
def plain_greedy(tiny_cpu):
    """The non-speculative build's greedy text (refengine in this process, the shared tiny-cpu engine)."""
    greedy_text = greedy_reference(tiny_cpu["engine"], tiny_cpu["tokenizer"], MAX_TOKENS)
    texts = {prompt: greedy_text(prompt) for prompt in PROMPTS}
    assert greedy_text.engine.stats().num_draft_tokens == 0
    return texts


def _infer(server, model: str, prompt: str, **extra) -> dict:
    """One non-streamed request over a gRPC stream (the models are decoupled): its text and draft figures."""
    inputs = infer_inputs(
        {
            "text_input": np.array([[prompt.encode()]], dtype=np.object_),
            "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
            "return_perf_metrics": np.array([[True]], dtype=np.bool_),
            **{name: value if isinstance(value, np.ndarray) else np.array([[value]], dtype=np.int32) for name, value in extra.items()},
        }
    )
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", *DRAFT_FIGURES)]
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.options.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, outputs=outputs, request_id=uuid.uuid4().hex)
        result, error = answers.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    if error is not None:
        raise error
    figures = {name: result.as_numpy(name).reshape(-1)[0].item() for name in DRAFT_FIGURES}
    return {
        "text": result.as_numpy("text_output").reshape(-1)[0].decode(),
        "drafted": figures["total_draft_tokens"],
        "accepted": figures["total_accepted_draft_tokens"],
        "acceptance_rate": figures["acceptance_rate"],
    }


def _settled_metrics(server, shows) -> dict[str, float]:
    """/metrics once the cpu models' counters (refreshed every 100 ms) show this process's request (`shows`) and two
    reads 0.3 s apart agree: two stale reads of a refresh a loaded machine delays agree too. 60 s: a hang guard."""
    last, deadline = metrics(server.options.metrics_url), time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if (current := metrics(server.options.metrics_url)) == last and shows(current):
            return current
        last = current
    raise AssertionError(f"/metrics never settled on the request's counts: {last}")


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_speculative_greedy_answers_equal_the_non_speculative_build(server, plain_greedy, model):
    drafted = accepted = 0
    for prompt in PROMPTS:
        answer = _infer(server, served_name("draft", model), prompt)
        assert answer["text"] == plain_greedy[prompt], prompt
        assert answer["drafted"] > 0 and 0 <= answer["accepted"] <= answer["drafted"]
        assert answer["acceptance_rate"] == pytest.approx(answer["accepted"] / answer["drafted"], abs=1e-6)
        drafted, accepted = drafted + answer["drafted"], accepted + answer["accepted"]
    assert 0 < accepted < drafted  # the early-exit draft is accepted sometimes and rolled back sometimes


def test_bls_passes_num_draft_tokens_on(server, plain_greedy):
    prompt = PROMPTS[0]
    off = _infer(server, DRAFT_BLS, prompt, num_draft_tokens=0)
    assert (off["text"], off["drafted"], off["accepted"]) == (plain_greedy[prompt], 0, 0)
    one = _infer(server, DRAFT_BLS, prompt, num_draft_tokens=1)
    assert one["text"] == plain_greedy[prompt]
    # one draft token per target step: at most one per generated token, fewer than with the engine's 4
    assert 0 < one["drafted"] < MAX_TOKENS
    assert one["drafted"] < _infer(server, DRAFT_BLS, prompt)["drafted"]


@pytest.mark.parametrize(
    "value, message", [(5, "num_draft_tokens: 5 exceeds the engine's max_draft_len (4)"), (-1, "num_draft_tokens: must be 0 (no drafts) or more, got -1")]
)
def test_bls_refuses_a_bad_num_draft_tokens_by_name(server, value, message):
    with pytest.raises(InferenceServerException, match=message.replace("(", r"\(").replace(")", r"\)")):
        _infer(server, DRAFT_BLS, PROMPTS[0], num_draft_tokens=value)


def test_bls_passes_use_draft_logits_on(server, plain_greedy):
    """Greedy: either way the answer is plain greedy's. Sampled (seeded, so reproducible): accepting by comparing tokens
    (false) keeps fewer drafts than accepting by the draft's distribution (true), so the engine got the setting."""
    flag = lambda value: np.array([[value]], dtype=np.bool_)  # noqa: E731
    for value in (True, False):
        assert _infer(server, DRAFT_BLS, PROMPTS[0], use_draft_logits=flag(value))["text"] == plain_greedy[PROMPTS[0]]
    sampled = {"temperature": np.array([[1.0]], dtype=np.float32), "top_p": np.array([[1.0]], dtype=np.float32)}  # top_p 0 is greedy
    accepted = {
        value: sum(
            _infer(server, DRAFT_BLS, prompt, use_draft_logits=flag(value), seed=np.array([[7 + i]], dtype=np.uint64), **sampled)["accepted"]
            for i, prompt in enumerate(PROMPTS)
        )
        for value in (True, False)
    }
    assert accepted[False] < accepted[True]
    with pytest.raises(InferenceServerException, match=r"use_draft_logits: true needs num_draft_tokens > 0"):
        _infer(server, DRAFT_BLS, PROMPTS[0], num_draft_tokens=0, use_draft_logits=flag(True))


def test_prometheus_counts_drafted_and_accepted_tokens(server):
    def drafted(published) -> float:
        return metric(published, "trtllm_pipeline_draft_tokens_total", model=served_name("draft", "tensorrt_llm"), draft_token_type="drafted")

    before = drafted(metrics(server.options.metrics_url))
    _infer(server, served_name("draft", "ensemble"), PROMPTS[1])
    published = _settled_metrics(server, lambda current: drafted(current) > before)
    counts = {
        kind: metric(published, "trtllm_pipeline_draft_tokens_total", model=served_name("draft", "tensorrt_llm"), draft_token_type=kind)
        for kind in ("drafted", "accepted")
    }
    assert counts["drafted"] > 0 and 0 < counts["accepted"] <= counts["drafted"]


# -- Medusa ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_medusa_greedy_answers_equal_the_plain_build(server, plain_greedy, model):
    accepted = 0
    for prompt in PROMPTS:
        answer = _infer(server, served_name("medusa", model), prompt)
        assert answer["text"] == plain_greedy[prompt], prompt
        assert answer["drafted"] > 0 and 0 <= answer["accepted"] <= answer["drafted"]  # tree nodes verified / accepted
        assert answer["acceptance_rate"] == pytest.approx(answer["accepted"] / answer["drafted"], abs=1e-6)
        accepted += answer["accepted"]
    assert accepted > 0  # the trained heads guess right often


def test_medusa_streams_over_grpc_and_answers_http(server, plain_greedy):
    prompt = PROMPTS[0]
    deltas = stream_infer(server.options.grpc_url, MEDUSA_ENSEMBLE, client_inputs(prompt, MAX_TOKENS, stream=True))
    assert len(deltas) > 1 and "".join(deltas) == plain_greedy[prompt]
    status, body = http_generate(server.options.http_url, MEDUSA_ENSEMBLE, {"text_input": prompt, "max_tokens": MAX_TOKENS})
    assert (status, body.get("text_output")) == (200, plain_greedy[prompt])


def test_medusa_refuses_beams_and_external_drafts_by_name(server):
    status, body = http_generate(server.options.http_url, MEDUSA_ENSEMBLE, {"text_input": PROMPTS[0], "max_tokens": 4, "beam_width": 2})
    assert status == 400 and "beam_width: 2 exceeds the engine's max_beam_width 1" in body["error"], body
    with pytest.raises(InferenceServerException, match=r"num_draft_tokens: the engine was built without draft-target"):
        _infer(server, served_name("medusa", "tensorrt_llm_bls"), PROMPTS[0], num_draft_tokens=2)
    inputs = infer_inputs(
        {
            "input_ids": np.array([[1, 2, 3]], dtype=np.int32),
            "input_lengths": np.array([[3]], dtype=np.int32),
            "request_output_len": np.array([[4]], dtype=np.int32),
            "num_draft_tokens": np.array([[2]], dtype=np.int32),
        }
    )
    with pytest.raises(InferenceServerException, match=r"num_draft_tokens: 2: a Medusa engine drafts with its own heads"):
        stream_infer(server.options.grpc_url, MEDUSA_LLM, inputs, output="output_ids")


def test_prometheus_counts_medusa_tree_steps_and_acceptances_by_depth(server):
    def steps(published) -> float:
        return metric(published, "trtllm_pipeline_medusa_tree_steps_total", model=MEDUSA_LLM)

    before = steps(metrics(server.options.metrics_url))
    _infer(server, MEDUSA_ENSEMBLE, PROMPTS[2])
    published = _settled_metrics(server, lambda current: steps(current) > before)
    steps = metric(published, "trtllm_pipeline_medusa_tree_steps_total", model=MEDUSA_LLM)
    by_depth = {
        name: value for name, value in published.items() if name.startswith("trtllm_pipeline_medusa_accepted_tokens_total{") and f'model="{MEDUSA_LLM}"' in name
    }
    accepted = metric(published, "trtllm_pipeline_draft_tokens_total", model=MEDUSA_LLM, draft_token_type="accepted")
    assert steps > 0 and accepted > 0
    assert len(by_depth) == medusa_num_heads() and sum(by_depth.values()) == accepted  # depth 1 .. the number of heads
    assert not any(name.startswith("trtllm_pipeline_medusa_") and 'model="draft-' in name for name in published)


def test_the_openai_front_end_on_the_medusa_build_answers_as_plain(server, plain_greedy):
    """The front end reads the model's limits and tokenizer through Triton's model-configuration API (renamed models)."""
    route = served_name("medusa", front_end_triton_model("ensemble"))
    with (
        running_openai_server(server.options.grpc_url, model_name="tiny-cpu-medusa", triton_model=route) as base_url,
        openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client,
    ):
        completion = client.completions.create(model="tiny-cpu-medusa", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0)
    assert completion.choices[0].text == plain_greedy[PROMPTS[1]]


def test_a_medusa_choices_parameter_deeper_than_the_heads_fails_the_load_by_name(repository, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from pipeline.errors import ToolError
    from pipeline.serve import TritonServer

    alone = tmp_path / "model_repository"
    shutil.copytree(repository / MEDUSA_LLM, alone / MEDUSA_LLM)
    path = alone / MEDUSA_LLM / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    too_deep = medusa_num_heads() + 1
    config.parameters["medusa_choices"].string_value = ", ".join("{" + ", ".join(["0"] * depth) + "}" for depth in range(1, too_deep + 1))
    path.write_text(text_format.MessageToString(config))
    (tmp_path / "workspace").mkdir()
    triton = TritonServer(loopback_options(alone), workspace=tmp_path / "workspace").start()
    try:
        with pytest.raises(ToolError):
            triton.wait_until_ready(timeout=60)
    finally:
        triton.stop()
    log = (tmp_path / "workspace" / "tritonserver.log").read_text(errors="replace")
    assert f"medusa_choices: path [{', '.join(['0'] * too_deep)}] is {too_deep} deep; the engine has {too_deep - 1} Medusa heads" in log

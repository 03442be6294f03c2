"""A speculative cpu-target repository in the real tritonserver: draft-target decoding served end to end.

The engine is composed the way the cpu build composes build_configs/tiny-cpu-draft-target.yaml (its build_config,
its draft's build_config, `add_speculation`, the package stage's render), from the session's shared tiny-cpu
checkpoint, so no second export runs: the draft is the target's first two layers with its final norm and lm_head
(an early-exit draft: same tokenizer, cheap, agrees with the target often, not always — so drafts are both
accepted and rolled back). Greedy answers through the ensemble and the BLS equal the non-speculative engine's
(refengine in this process, on the shared build), the perf-metric outputs and the Prometheus draft-token counter
count drafts, and the BLS passes the request's num_draft_tokens (0: no drafts; above max_draft_len: refused) and use_draft_logits on.
"""

from __future__ import annotations

import json
import os
import queue
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.serving import REPO, greedy_reference, infer_inputs, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = ["def foo(x):\n    return", "import os\n", "for i in range("]
MAX_TOKENS = 20
DRAFT_LAYERS = 2
DRAFT_FIGURES = ("acceptance_rate", "total_draft_tokens", "total_accepted_draft_tokens")


def _early_exit_checkpoint(checkpoint: Path, out: Path, num_layers: int) -> Path:
    """The checkpoint's first `num_layers` layers as a checkpoint of its own (weights linked; the rest unread)."""
    out.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            os.symlink(path.resolve(), out / path.name)
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config))
    return out


def build_speculative_repository(shared: dict[str, Path], work: Path) -> Path:
    """engine (with draft/) and model repository, as `run tiny-cpu-draft-target.yaml --until package` lays them out."""
    from pipeline.backends.cpu import cpu_build_config, write_cpu_engine
    from pipeline.backends.cpu_speculative import add_speculation
    from pipeline.config.loader import load_config
    from pipeline.config.spec.draft import draft_spec
    from pipeline.render import render_model_repository
    from pipeline.stages.quantize import CHECKPOINT_DIR

    spec = load_config(REPO / "build_configs" / "tiny-cpu-draft-target.yaml").spec
    [checkpoint] = shared["root"].glob(f"tiny-cpu/quantize-*/{CHECKPOINT_DIR}")
    draft = draft_spec(spec)
    draft_dir = work / "draft-engine"
    write_cpu_engine(
        _early_exit_checkpoint(checkpoint, work / "draft-checkpoint", DRAFT_LAYERS), draft_dir,
        build_config=cpu_build_config(draft.build, max_seq_len=draft.build.max_seq_len, dtype=draft.model.dtype.value), version="test",
    )
    engine_dir = work / "engine"
    build_config = cpu_build_config(spec.build, max_seq_len=spec.build.max_seq_len, dtype=spec.model.dtype.value)
    write_cpu_engine(checkpoint, engine_dir, build_config=build_config, version="test")
    add_speculation(engine_dir, spec.build.speculative, draft_dir, max_seq_len=build_config["max_seq_len"])
    repository = work / "model_repository"
    render_model_repository(engine_dir=engine_dir, tokenizer_dir=shared["tokenizer"], serve=spec.serve, target="cpu",
                            out_dir=repository, speculative=spec.build.speculative)
    return repository


@pytest.fixture(scope="module")
def server(tiny_cpu, tmp_path_factory):
    repository = build_speculative_repository(tiny_cpu, tmp_path_factory.mktemp("speculative"))
    with serving_repository(repository, tmp_path_factory.mktemp("serve-speculative")) as triton:
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
    inputs = infer_inputs({
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32),
        "return_perf_metrics": np.array([[True]], dtype=np.bool_),
        **{name: value if isinstance(value, np.ndarray) else np.array([[value]], dtype=np.int32) for name, value in extra.items()},
    })
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
    return {"text": result.as_numpy("text_output").reshape(-1)[0].decode(), "drafted": figures["total_draft_tokens"],
            "accepted": figures["total_accepted_draft_tokens"], "acceptance_rate": figures["acceptance_rate"]}


def _draft_counter(server) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(server.options.metrics_url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    counts = {}
    for line in lines:
        if line.startswith("trtllm_pipeline_draft_tokens_total{"):
            name, _, value = line.rpartition(" ")
            counts[name.split('draft_token_type="')[1].split('"')[0]] = float(value)
    return counts


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_speculative_greedy_answers_equal_the_non_speculative_build(server, plain_greedy, model):
    drafted = accepted = 0
    for prompt in PROMPTS:
        answer = _infer(server, model, prompt)
        assert answer["text"] == plain_greedy[prompt], prompt
        assert answer["drafted"] > 0 and 0 <= answer["accepted"] <= answer["drafted"]
        assert answer["acceptance_rate"] == pytest.approx(answer["accepted"] / answer["drafted"], abs=1e-6)
        drafted, accepted = drafted + answer["drafted"], accepted + answer["accepted"]
    assert 0 < accepted < drafted  # the early-exit draft is accepted sometimes and rolled back sometimes


def test_bls_passes_num_draft_tokens_on(server, plain_greedy):
    prompt = PROMPTS[0]
    off = _infer(server, "tensorrt_llm_bls", prompt, num_draft_tokens=0)
    assert (off["text"], off["drafted"], off["accepted"]) == (plain_greedy[prompt], 0, 0)
    one = _infer(server, "tensorrt_llm_bls", prompt, num_draft_tokens=1)
    assert one["text"] == plain_greedy[prompt]
    # one draft token per target step: at most one per generated token, fewer than with the engine's 4
    assert 0 < one["drafted"] < MAX_TOKENS
    assert one["drafted"] < _infer(server, "tensorrt_llm_bls", prompt)["drafted"]


@pytest.mark.parametrize("value, message", [(5, "num_draft_tokens: 5 exceeds the engine's max_draft_len (4)"),
                                            (-1, "num_draft_tokens: must be 0 (no drafts) or more, got -1")])
def test_bls_refuses_a_bad_num_draft_tokens_by_name(server, value, message):
    with pytest.raises(InferenceServerException, match=message.replace("(", r"\(").replace(")", r"\)")):
        _infer(server, "tensorrt_llm_bls", PROMPTS[0], num_draft_tokens=value)


def test_bls_passes_use_draft_logits_on(server, plain_greedy):
    """Greedy: either way the answer is plain greedy's. Sampled (seeded, so reproducible): accepting by comparing tokens
    (false) keeps fewer drafts than accepting by the draft's distribution (true), so the engine got the setting."""
    flag = lambda value: np.array([[value]], dtype=np.bool_)  # noqa: E731
    for value in (True, False):
        assert _infer(server, "tensorrt_llm_bls", PROMPTS[0], use_draft_logits=flag(value))["text"] == plain_greedy[PROMPTS[0]]
    sampled = {"temperature": np.array([[1.0]], dtype=np.float32), "top_p": np.array([[1.0]], dtype=np.float32)}  # top_p 0 is greedy
    accepted = {value: sum(_infer(server, "tensorrt_llm_bls", prompt, use_draft_logits=flag(value), seed=np.array([[7 + i]], dtype=np.uint64),
                                  **sampled)["accepted"] for i, prompt in enumerate(PROMPTS)) for value in (True, False)}
    assert accepted[False] < accepted[True]
    with pytest.raises(InferenceServerException, match=r"use_draft_logits: true needs num_draft_tokens > 0"):
        _infer(server, "tensorrt_llm_bls", PROMPTS[0], num_draft_tokens=0, use_draft_logits=flag(True))


def test_prometheus_counts_drafted_and_accepted_tokens(server):
    _infer(server, "ensemble", PROMPTS[1])
    counts = _draft_counter(server)
    assert counts["drafted"] > 0 and 0 < counts["accepted"] <= counts["drafted"]

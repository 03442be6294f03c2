"""Multi-LoRA on the cpu target in the real tritonserver: NVIDIA's lora_task_id / lora_weights / lora_config through the
ensemble, the BLS and tensorrt_llm, one server for the module.

The engine is the shared tiny-cpu checkpoint built as `build.lora` builds it (adapter models/tiny-stdlib-llama-turtle-lora,
so the LoRA plugin and lora_config are recorded), packaged with `serve.lora.prefetch_dir` holding one adapter under task
id PREFETCHED. Greedy answers are compared with refengine in this process, given the same adapter (refengine's own tests
compare its adapters with transformers + peft merged, token for token); the adapter changes the answers.
"""

from __future__ import annotations

import queue
import sys
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clients.lora_tensors import convert_peft_adapter, write_lora_tensors
from tests.support.serving import MODEL_CODE, REPO, infer_inputs, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ADAPTER = REPO / "models" / "tiny-stdlib-llama-turtle-lora"
PROMPTS = ["def foo(x):\n    return", "import turtle\n", "for i in range("]
MAX_TOKENS = 16
PREFETCHED = 100
MODELS = ("ensemble", "tensorrt_llm_bls")


@pytest.fixture(scope="module")
def adapters():
    """Two adapters as the request tensors: the turtle adapter, and the same with its values × 2 (A and B both: the
    update × 4, another adapter)."""
    turtle = convert_peft_adapter(ADAPTER)
    return {"turtle": (turtle.weights, turtle.config), "other": (turtle.weights * 2, turtle.config)}


@pytest.fixture(scope="module")
def lora_build(tiny_cpu, tmp_path_factory):
    """engine and repository of the shared checkpoint built with build.lora, with a prefetch dir."""
    from pipeline.backends.cpu.target import cpu_build_config, write_cpu_engine
    from pipeline.config.loader import load_config
    from pipeline.render import RepositoryRequest, render_model_repository
    from pipeline.stages.quantize import CHECKPOINT_DIR

    work = tmp_path_factory.mktemp("lora")
    prefetch = work / "prefetch"
    write_lora_tensors(convert_peft_adapter(ADAPTER), prefetch / str(PREFETCHED))
    (prefetch / "not-a-task").mkdir()  # skipped, as TensorRT-LLM skips it
    spec = load_config(REPO / "build_configs" / "tiny-cpu.yaml", [f"build.lora.adapter_dirs=[{ADAPTER}]", f"serve.lora.prefetch_dir={prefetch}"]).spec
    [checkpoint] = tiny_cpu["root"].glob(f"tiny-cpu/quantize-*/{CHECKPOINT_DIR}")
    engine_dir = work / "engine"
    write_cpu_engine(
        checkpoint, engine_dir, version="test", build_config=cpu_build_config(spec.build, max_seq_len=spec.build.max_seq_len, dtype=spec.model.dtype.value)
    )
    repository = work / "model_repository"
    render_model_repository(RepositoryRequest(engine_dir=engine_dir, tokenizer_dir=tiny_cpu["tokenizer"], serve=spec.serve, target="cpu", out_dir=repository))
    return {"engine": engine_dir, "repository": repository}


@pytest.fixture(scope="module")
def server(lora_build, tmp_path_factory):
    with serving_repository(lora_build["repository"], tmp_path_factory.mktemp("serve-lora")) as triton:
        yield triton


@pytest.fixture(scope="module")
def reference(lora_build, tiny_cpu, adapters):
    """refengine's greedy text per (adapter name or None, prompt), in this process, decoded as postprocessing does."""
    import torch

    sys.path.insert(0, str(MODEL_CODE))
    try:
        from hf_tokenizer import HFTokenizer
        from incremental_detokenizer import CONTEXT_TOKENS, text_delta
    finally:
        sys.path.remove(str(MODEL_CODE))
    from refengine import LLMEngine, LoraRequest, SamplingParams

    torch.set_num_threads(1)
    tokenizer = HFTokenizer(tiny_cpu["tokenizer"])
    engine = LLMEngine.from_engine_dir(lora_build["engine"])
    requests = {name: LoraRequest(index + 1, *tensors) for index, (name, tensors) in enumerate(adapters.items())}
    texts = {}
    for name in (None, *requests):
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            [output] = engine.generate([ids], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, end_id=tokenizer.eos_id), lora=requests.get(name))
            texts[name, prompt] = text_delta(tokenizer.decode, ids[-CONTEXT_TOKENS:], list(output.outputs[0].token_ids))
    return texts


@pytest.fixture(scope="module")
def peft_merged(tiny_cpu):
    """transformers + peft's greedy text per prompt with the turtle adapter merged (float32), decoded as postprocessing does."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(MODEL_CODE))
    try:
        from hf_tokenizer import HFTokenizer
        from incremental_detokenizer import CONTEXT_TOKENS, text_delta
    finally:
        sys.path.remove(str(MODEL_CODE))
    tokenizer = HFTokenizer(tiny_cpu["tokenizer"])
    base = AutoModelForCausalLM.from_pretrained(str(REPO / "models" / "tiny-stdlib-llama"), torch_dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(ADAPTER)).merge_and_unload().eval()
    texts = {}
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            generated = merged.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.eos_id,
            )
        new = generated[0, len(ids) :].tolist()
        if tokenizer.eos_id in new:  # the ensemble's text stops before the end token
            new = new[: new.index(tokenizer.eos_id)]
        texts[prompt] = text_delta(tokenizer.decode, ids[-CONTEXT_TOKENS:], new)
    return texts


def _inputs(prompt: str, task_id: int | None = None, tensors=None, **extra) -> list:
    arrays = {"text_input": np.array([[prompt.encode()]], dtype=np.object_), "max_tokens": np.array([[MAX_TOKENS]], dtype=np.int32)}
    if task_id is not None:
        arrays["lora_task_id"] = np.array([[task_id]], dtype=np.uint64)
    if tensors is not None:
        arrays["lora_weights"], arrays["lora_config"] = tensors
    arrays.update(extra)
    return infer_inputs(arrays)


def _stream(server, model: str, requests: list[list]) -> tuple[list[str | None], list[Exception]]:
    """Send every request at once over one gRPC stream (the model is decoupled): each one's text (None if it failed),
    and the errors (a stream's error carries no request id)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.options.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    ids = [uuid.uuid4().hex for _ in requests]
    texts, errors = {}, []
    try:
        for request_id, inputs in zip(ids, requests):
            client.async_stream_infer(model, inputs, request_id=request_id)
        while len(texts) + len(errors) < len(requests):
            result, error = answers.get(timeout=180)
            if error is not None:
                errors.append(error)
            else:
                texts[result.get_response().id] = result.as_numpy("text_output").reshape(-1)[0].decode()
    finally:
        client.stop_stream()
        client.close()
    return [texts.get(request_id) for request_id in ids], errors


def _one(server, model: str, inputs: list) -> str:
    [text], errors = _stream(server, model, [inputs])
    if errors:
        raise errors[0]
    return text


@pytest.mark.parametrize("model", MODELS)
def test_an_adapter_sent_with_its_first_request_then_by_id_alone_answers_as_refengine(server, reference, adapters, model):
    task_id = 1 if model == "ensemble" else 11
    for index, prompt in enumerate(PROMPTS):
        tensors = adapters["turtle"] if index == 0 else None  # weights with the first request, the id afterwards
        assert _one(server, model, _inputs(prompt, task_id, tensors)) == reference["turtle", prompt], prompt
    assert any(reference["turtle", p] != reference[None, p] for p in PROMPTS)  # the adapter changes the answers


def test_the_served_adapter_answers_as_transformers_peft_with_it_merged(server, peft_merged, adapters):
    for index, prompt in enumerate(PROMPTS):
        assert _one(server, "ensemble", _inputs(prompt, 41, adapters["turtle"] if index == 0 else None)) == peft_merged[prompt], prompt


def test_a_prefetched_adapter_answers_by_id_alone(server, reference):
    for model in MODELS:
        assert _one(server, model, _inputs(PROMPTS[1], PREFETCHED)) == reference["turtle", PROMPTS[1]]


@pytest.mark.parametrize("model", MODELS)
def test_an_uncached_task_id_is_refused_with_tensorrt_llms_text(server, model):
    with pytest.raises(InferenceServerException) as refused:
        _one(server, model, _inputs(PROMPTS[0], 987654))
    assert "lora_task_id: LoRA task 987654 not found in cache. Please send LoRA weights with request" in str(refused.value)


def test_a_batch_mixing_two_adapters_and_the_base_model_answers_each_as_alone(server, reference, adapters):
    cases = [(name, prompt) for prompt in PROMPTS for name in (None, "turtle", "other")]
    ids = {"turtle": 21, "other": 22}
    texts, errors = _stream(server, "ensemble", [_inputs(prompt, ids.get(name), adapters.get(name)) for name, prompt in cases])
    assert not errors
    assert texts == [reference[case] for case in cases]
    assert any(reference["other", p] != reference["turtle", p] for p in PROMPTS)


def test_bad_lora_inputs_are_refused_by_name_and_other_requests_are_unaffected(server, reference, adapters):
    weights, config = adapters["turtle"]
    nan = weights.copy()
    nan[0, 0, 0] = np.nan
    bad_rank = config.copy()
    bad_rank[0, 0, 2] = 4096
    _one(server, "ensemble", _inputs(PROMPTS[2], 34, adapters["turtle"]))
    bad = {
        "lora_config: is missing: lora_weights came without it": _inputs(PROMPTS[0], 31, None, lora_weights=weights),
        "lora_weights: row 0 holds NaN": _inputs(PROMPTS[0], 32, (nan, config)),
        "lora_config: row 0 (attn_q, layer 0, rank 4096): rank 4096 exceeds": _inputs(PROMPTS[0], 33, (weights, bad_rank)),
        "lora_task_id: LoRA task 34 is cached with other weights": _inputs(PROMPTS[0], 34, adapters["other"]),
    }
    for needle, inputs in bad.items():
        with pytest.raises(InferenceServerException) as refused:
            _one(server, "ensemble", inputs)
        assert needle in str(refused.value)
    good = [_inputs(PROMPTS[2]), _inputs(PROMPTS[2], 34)]
    texts, errors = _stream(server, "ensemble", [*bad.values(), *good])  # the same refusals beside two good requests
    assert len(errors) == len(bad)
    assert texts[len(bad) :] == [reference[None, PROMPTS[2]], reference["turtle", PROMPTS[2]]]


# -- clients: the library, infer, the OpenAI front end ----------------------------------------------------------------
def _url(server, protocol: str) -> str:
    return server.options.grpc_url if protocol == "grpc" else server.options.http_url


def test_the_client_library_sends_the_weights_first_then_the_id_and_again_when_the_server_lost_it(server, reference, tmp_path):
    from clients import LoraAdapter, TritonLLMClient

    converted = tmp_path / "converted"
    write_lora_tensors(convert_peft_adapter(ADAPTER), converted)
    with TritonLLMClient(server.options.grpc_url, "grpc", timeout=120) as client:
        adapter = LoraAdapter.from_dir(converted, 61)
        for prompt in PROMPTS[:2]:
            assert client.generate(prompt, max_tokens=MAX_TOKENS, lora=adapter).text == reference["turtle", prompt]
        assert not client.sent_adapters.needs_weights(adapter)  # sent once, the id alone afterwards
    with TritonLLMClient(server.options.grpc_url, "grpc", timeout=120) as fresh:  # knows nothing: the server's cache does
        assert fresh.generate(PROMPTS[2], max_tokens=MAX_TOKENS, lora=LoraAdapter(61)).text == reference["turtle", PROMPTS[2]]
        lost = LoraAdapter.from_dir(ADAPTER, 62)  # the PEFT dir; this client believes it sent it already
        fresh.sent_adapters.needs_weights(lost)
        assert fresh.generate(PROMPTS[0], max_tokens=MAX_TOKENS, lora=lost).text == reference["turtle", PROMPTS[0]]


def test_over_http_the_id_alone_is_sent_and_fp16_weights_are_refused_by_name(server, reference):
    from clients import InvalidRequestError, LoraAdapter, TritonLLMClient

    with TritonLLMClient(server.options.http_url, "http", timeout=120) as client:
        assert client.generate(PROMPTS[1], max_tokens=MAX_TOKENS, lora=LoraAdapter(61)).text == reference["turtle", PROMPTS[1]]
        with pytest.raises(InvalidRequestError, match="lora_weights: Triton's HTTP generate endpoint takes no float16 values"):
            client.generate(PROMPTS[1], max_tokens=MAX_TOKENS, lora=LoraAdapter.from_dir(ADAPTER, 63))


def test_infer_sends_an_adapter_dir_and_names_an_uncached_id(server, reference):
    import argparse
    import io

    from clients.cli import add_infer_arguments, run_infer

    parser = add_infer_arguments(argparse.ArgumentParser())
    base = [PROMPTS[1], "--url", server.options.grpc_url, "--max-tokens", str(MAX_TOKENS)]
    out = io.StringIO()
    assert run_infer(parser.parse_args(base + ["--lora-dir", str(ADAPTER), "--lora-task-id", "71"]), out=out) == 0
    assert out.getvalue() == reference["turtle", PROMPTS[1]] + "\n"
    out = io.StringIO()
    assert run_infer(parser.parse_args(base + ["--lora-task-id", "71"]), out=out) == 0  # the id alone: cached now
    assert out.getvalue() == reference["turtle", PROMPTS[1]] + "\n"
    err = io.StringIO()
    assert run_infer(parser.parse_args(base + ["--lora-task-id", "72"]), out=io.StringIO(), err=err) == 1
    assert "lora_task_id: LoRA task 72 not found in cache. Please send LoRA weights with request" in err.getvalue()


def test_the_openai_front_end_serves_each_adapter_as_a_model(server, lora_build, reference):
    import httpx

    from clients import LoraAdapter
    from clients.openai_server import running_openai_server

    adapters = {"turtle": LoraAdapter.from_dir(ADAPTER, 81)}
    with (
        running_openai_server(server.options.grpc_url, model_name="tiny-cpu", model_repository=lora_build["repository"], adapters=adapters) as base_url,
        httpx.Client(base_url=base_url, timeout=120) as http,
    ):
        listed = http.get("/models").json()["data"]
        assert [(card["id"], card["parent"]) for card in listed] == [("tiny-cpu", None), ("turtle", "tiny-cpu")]
        for model, name in (("turtle", "turtle"), ("tiny-cpu", None)):
            for prompt in PROMPTS[:2]:  # the adapter's weights go with its first request only
                body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
                answer = http.post("/completions", json=body).json()
                assert (answer["model"], answer["choices"][0]["text"]) == (model, reference[name, prompt])
        unknown = http.post("/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "The model `nope` does not exist. Served models: tiny-cpu, turtle."

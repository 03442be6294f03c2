"""The calls NVIDIA's own Triton client scripts make (TensorRT-LLM `triton_backend/`:
`inflight_batcher_llm/client/end_to_end_grpc_client.py`, `tools/inflight_batcher_llm/end_to_end_test.py`),
made here with the same tensors, dtypes, shapes and requested outputs, and read the way the scripts
read them (`as_numpy("text_output")[0].decode()`, `as_numpy(metric)[0][0]`). The scripts themselves
are NVIDIA's code and are not in this repository; docs/serving.md says which were run by hand, unmodified.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer
from tritonclient.utils import InferenceServerException

from tests.support.serving import infer_inputs, serving_repository

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "def __init__(self"
OUTPUT_LEN = 12
PERF_METRICS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
MODELS = ("ensemble", "tensorrt_llm_bls")


@pytest.fixture(scope="module")
def served(tiny_cpu, tmp_path_factory):
    with serving_repository(tiny_cpu["repository"], tmp_path_factory.mktemp("serve")) as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer(tiny_cpu):
    return AutoTokenizer.from_pretrained(str(tiny_cpu["tokenizer"]), local_files_only=True)


def nvidia_inputs(prompt: str = PROMPT, *, streaming: bool, **extra: np.ndarray) -> dict[str, np.ndarray]:
    """end_to_end_grpc_client.prepare_inputs, as it builds them for one prompt."""
    text = np.array([[prompt]]).astype(object)
    return {
        "text_input": text,
        "max_tokens": np.ones_like(text).astype(np.int32) * OUTPUT_LEN,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
        **extra,
    }


def batch_inputs(prompts: list[str], *, streaming: bool) -> dict[str, np.ndarray]:
    """--batch-inputs: every input of the prompts concatenated along the batch axis."""
    rows = [nvidia_inputs(prompt, streaming=streaming) for prompt in prompts]
    return {name: np.concatenate([row[name] for row in rows], axis=0) for name in rows[0]}


def run(url: str, model: str, arrays: dict[str, np.ndarray], outputs: tuple[str, ...] = ("text_output",), extra_outputs: tuple[str, ...] = ()) -> list:
    """One request over a gRPC stream, as the script sends it (its outputs requested by name);
    every result, or the first error raised."""
    requested = [grpcclient.InferRequestedOutput(name) for name in (*outputs, *extra_outputs)]
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        client.async_stream_infer(model, infer_inputs(arrays), outputs=requested, request_id="nvidia-1")
        client.stop_stream()  # the script's way: waits until the server closes the stream
    finally:
        client.close()
    answers = []
    while not results.empty():
        item = results.get()
        if isinstance(item, InferenceServerException):
            raise item
        answers.append(item)
    return answers


def texts(results) -> list[str]:
    return [result.as_numpy("text_output")[0].decode("utf-8") for result in results]


@pytest.mark.parametrize("model", MODELS)
def test_text_output_reads_as_the_script_reads_it_streamed_or_not(served, model):
    url = served.options.grpc_url
    [whole] = run(url, model, nvidia_inputs(streaming=False))
    assert whole.as_numpy("text_output").shape == (1,)  # NVIDIA's wire shape for one sequence
    streamed = run(url, model, nvidia_inputs(streaming=True))
    assert all(result.as_numpy("text_output").shape == (1,) for result in streamed)
    assert texts([whole]) == [PROMPT + "".join(texts(streamed))]  # exclude_input_in_output false
    assert len(streamed) > 1


@pytest.mark.parametrize("model", MODELS)
def test_perf_metrics_and_token_counts_are_real(served, model, tokenizer):
    flags = {name: np.array([[True]], dtype=bool) for name in ("return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens")}
    arrays = nvidia_inputs(streaming=True, **flags)
    results = run(served.options.grpc_url, model, arrays, extra_outputs=(*PERF_METRICS, "num_input_tokens", "num_output_tokens", "batch_index"))
    for result in results:
        values = {name: result.as_numpy(name)[0][0] for name in PERF_METRICS}  # the script's indexing
        assert values["arrival_time_ns"] <= values["first_scheduled_time_ns"] <= values["first_token_time_ns"] <= values["last_token_time_ns"]
        assert values["kv_cache_alloc_total_blocks"] == values["kv_cache_alloc_new_blocks"] + values["kv_cache_reused_blocks"] >= 1
        assert (values["total_draft_tokens"], values["total_accepted_draft_tokens"], values["acceptance_rate"]) == (0, 0, 0.0)
        assert result.as_numpy("arrival_time_ns").dtype == np.int64 and result.as_numpy("batch_index")[0][0] == 0
    last = results[-1]
    assert last.as_numpy("num_input_tokens")[0][0] == len(tokenizer(PROMPT)["input_ids"])
    assert last.as_numpy("num_output_tokens")[0][0] == OUTPUT_LEN
    counts = [int(result.as_numpy("num_output_tokens")[0][0]) for result in results]
    assert counts == sorted(counts)  # tokens so far, response by response


@pytest.mark.parametrize("model", MODELS)
def test_two_return_sequences_are_told_apart_by_sequence_index(served, model):
    arrays = nvidia_inputs(streaming=False, num_return_sequences=np.array([[2]], dtype=np.int32))
    results = run(served.options.grpc_url, model, arrays, extra_outputs=("sequence_index",))
    assert sorted(int(result.as_numpy("sequence_index")[0][0]) for result in results) == [0, 1]
    assert all(text.startswith(PROMPT) for text in texts(results))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(lora_task_id=np.array([[7]], dtype=np.uint64)), "lora_task_id: this engine was built without LoRA"),  # no build.lora
        (
            dict(guided_decoding_guide=np.array([["[0-9]+"]]).astype(object)),
            "guided_decoding_guide_type: a guided_decoding_guide was given without a guide type",
        ),
        (dict(decoder_text_input=np.array([["bonjour"]]).astype(object)), "decoder_text_input: the engine is decoder-only"),
        (
            dict(num_return_sequences=np.array([[2]], dtype=np.int32), return_num_output_tokens=np.array([[True]], dtype=bool)),
            "return_num_output_tokens: not available with num_return_sequences 2",
        ),
    ],
    ids=["lora", "guided-decoding", "decoder-text", "token-count-with-n"],
)
def test_inputs_the_cpu_engine_cannot_honour_are_declared_and_refused_by_name(served, model, extra, message):
    with pytest.raises(InferenceServerException) as raised:
        run(served.options.grpc_url, model, nvidia_inputs(streaming=False, **extra))
    assert message in str(raised.value) and "unexpected" not in str(raised.value)


def test_preprocessing_gives_the_decoder_placeholder_and_tensorrt_llm_takes_it(served, tokenizer):
    """end_to_end_test.py calls the three models one by one and passes DECODER_INPUT_ID on."""
    client = grpcclient.InferenceServerClient(served.options.grpc_url)
    try:
        pre = client.infer(
            "preprocessing",
            infer_inputs({"QUERY": np.array([[PROMPT]]).astype(object), "REQUEST_OUTPUT_LEN": np.array([[OUTPUT_LEN]], dtype=np.int32)}),
            outputs=[
                grpcclient.InferRequestedOutput(name)
                for name in ("INPUT_ID", "REQUEST_INPUT_LEN", "DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN", "OUT_END_ID", "OUT_PAD_ID")
            ],
        )
    finally:
        client.close()
    assert pre.as_numpy("DECODER_INPUT_ID").shape == (1, 1) and pre.as_numpy("REQUEST_DECODER_INPUT_LEN").tolist() == [[1]]
    assert pre.as_numpy("DECODER_INPUT_ID")[0][0] == pre.as_numpy("OUT_PAD_ID")[0][0]
    assert pre.as_numpy("INPUT_ID").tolist() == [tokenizer(PROMPT)["input_ids"]]
    llm = {
        "input_ids": pre.as_numpy("INPUT_ID"),
        "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
        "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
        "decoder_input_lengths": pre.as_numpy("REQUEST_DECODER_INPUT_LEN"),
        "request_output_len": np.array([[OUTPUT_LEN]], dtype=np.int32),
        "end_id": pre.as_numpy("OUT_END_ID"),
        "pad_id": pre.as_numpy("OUT_PAD_ID"),
    }
    [result] = run(served.options.grpc_url, "tensorrt_llm", llm, outputs=("output_ids", "sequence_length"))
    assert result.as_numpy("output_ids").shape[:2] == (1, 1) and result.as_numpy("sequence_length")[0][0] == OUTPUT_LEN


@pytest.mark.parametrize("streaming", [False, True])
def test_batched_prompts_come_back_by_batch_index_from_the_ensemble(served, streaming):
    """--batch-inputs: the script concatenates every input along the batch axis (text_input
    [2, 1], ...) and files each response under result.as_numpy("batch_index")[0][0]."""
    url = served.options.grpc_url
    prompts = [PROMPT, "import"]
    alone = ["".join(texts(run(url, "ensemble", nvidia_inputs(prompt, streaming=streaming)))) for prompt in prompts]
    batched = batch_inputs(prompts, streaming=streaming)
    answers = ["", ""]
    for result in run(url, "ensemble", batched, extra_outputs=("batch_index",)):
        answers[int(result.as_numpy("batch_index")[0][0])] += result.as_numpy("text_output")[0].decode("utf-8")
    assert answers == alone


def test_the_bls_refuses_a_batch_by_name(served):
    batched = batch_inputs([PROMPT, "import"], streaming=False)
    with pytest.raises(InferenceServerException, match="text_input: tensorrt_llm_bls takes one prompt per request, got a batch of 2"):
        run(served.options.grpc_url, "tensorrt_llm_bls", batched)


@pytest.mark.parametrize("model", MODELS)
def test_embedding_bias_words_steer_the_output(served, model):
    """--embedding-bias-words W --embedding-bias-weights -100 for the first word of the greedy answer:
    the answer changes (refengine's own test shows the biased token is never chosen)."""
    [plain] = texts(run(served.options.grpc_url, model, nvidia_inputs(streaming=False)))
    word = plain[len(PROMPT) :].split()[0]
    arrays = nvidia_inputs(
        streaming=False,
        embedding_bias_words=np.array([[word]], dtype=object),
        embedding_bias_weights=np.array([[-100.0]], dtype=np.float32),
    )
    [biased] = texts(run(served.options.grpc_url, model, arrays))
    assert biased.startswith(PROMPT) and biased != plain
    with pytest.raises(InferenceServerException, match="embedding_bias_weights is missing"):
        run(served.options.grpc_url, model, nvidia_inputs(streaming=False, embedding_bias_words=np.array([[word]], dtype=object)))

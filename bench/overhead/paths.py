"""The overhead benchmark's measured paths (HTTP, gRPC, in-process, EngineLoop) and how a round is timed."""

from __future__ import annotations

import dataclasses
import http.client
import json
import queue
import time
import uuid
from pathlib import Path

from bench.overhead.environment import load_module

_RESPONSE_TIMEOUT_S = 120.0


# -- paths ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MeasuredPath:
    name: str  # JSON key
    label: str  # table row
    kind: str  # "inprocess" | "loop" | "http" | "grpc"
    model: str | None = None
    stream: bool = False


SINGLE_TOKEN_PATHS = (
    MeasuredPath("inprocess", "in-process: tokenize + `engine.generate` + detokenize", "inprocess"),
    MeasuredPath("inprocess_loop", "in-process: `EngineLoop` submit (step thread) + detokenize", "loop"),
    MeasuredPath("http_ensemble", "ensemble, HTTP `/generate`", "http", "ensemble"),
    MeasuredPath("grpc_ensemble", "ensemble, gRPC stream, `stream=false`", "grpc", "ensemble"),
    MeasuredPath("grpc_ensemble_streamed", "ensemble, gRPC stream, `stream=true`", "grpc", "ensemble", True),
    MeasuredPath("http_bls", "BLS, HTTP `/generate`", "http", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls", "BLS, gRPC stream, `stream=false`", "grpc", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls_streamed", "BLS, gRPC stream, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
STREAM_PATHS = (
    MeasuredPath("inprocess", "in-process: `engine.generate` N tokens + detokenize", "inprocess"),
    MeasuredPath("inprocess_loop_streamed", "in-process: `EngineLoop`, streamed, incremental detokenize", "loop", None, True),
    MeasuredPath("grpc_ensemble", "ensemble, gRPC, `stream=false`", "grpc", "ensemble"),
    MeasuredPath("grpc_ensemble_streamed", "ensemble, gRPC, `stream=true`", "grpc", "ensemble", True),
    MeasuredPath("grpc_bls", "BLS, gRPC, `stream=false`", "grpc", "tensorrt_llm_bls"),
    MeasuredPath("grpc_bls_streamed", "BLS, gRPC, `stream=true`", "grpc", "tensorrt_llm_bls", True),
)
# The 1-token row each N-token row is compared with (marginal cost of the other N - 1 tokens).
ONE_TOKEN_OF = {
    "inprocess": "inprocess",
    "inprocess_loop_streamed": "inprocess_loop",
    "grpc_ensemble": "grpc_ensemble",
    "grpc_ensemble_streamed": "grpc_ensemble_streamed",
    "grpc_bls": "grpc_bls",
    "grpc_bls_streamed": "grpc_bls_streamed",
}


@dataclasses.dataclass
class Sample:
    latency: float  # s, request sent → final response
    text: str
    responses: int  # responses carrying text (1 unless streamed)
    ttft: float | None = None  # s, request sent → first text response
    gaps: tuple[float, ...] = ()  # s, between consecutive text responses


# -- the workers: one per caller, reused across rounds -----------------------------------------
class Tokenizer:
    """The served repository's own tokenizer and detokenizer code, loaded in this process."""

    def __init__(self, repo: Path, tokenizer_dir: Path) -> None:
        hf_tokenizer = load_module(repo / "preprocessing" / "1" / "hf_tokenizer.py", "_serve_bench_hf_tokenizer")
        detok = load_module(repo / "postprocessing" / "1" / "incremental_detokenizer.py", "_serve_bench_incremental_detokenizer")
        self.tokenizer = hf_tokenizer.HFTokenizer(tokenizer_dir)
        self.text_delta = detok.text_delta
        self.context_tokens = detok.CONTEXT_TOKENS
        self.IncrementalDetokenizer = detok.IncrementalDetokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def delta(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        return self.text_delta(self.tokenizer.decode, prompt_ids[-self.context_tokens :], new_ids)


class InProcess:
    def __init__(self, engine, tok: Tokenizer, prompt: str, max_tokens: int) -> None:
        from refengine import SamplingParams

        self.engine, self.tok, self.prompt = engine, tok, prompt
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=tok.tokenizer.eos_id)

    def request(self) -> Sample:
        start = time.perf_counter()
        ids = self.tok.encode(self.prompt)
        [output] = self.engine.generate([ids], self.params)
        text = self.tok.delta(ids, list(output.outputs[0].token_ids))
        return Sample(time.perf_counter() - start, text, 1)

    def close(self) -> None:
        pass


class InProcessLoop:
    def __init__(self, loop, tok: Tokenizer, prompt: str, max_tokens: int, stream: bool) -> None:
        from refengine import SamplingParams

        self.loop, self.tok, self.prompt, self.stream = loop, tok, prompt, stream
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, end_id=tok.tokenizer.eos_id)

    def request(self) -> Sample:
        start = time.perf_counter()
        ids = self.tok.encode(self.prompt)
        stream = self.loop.submit(ids, self.params)
        if not self.stream:
            output = stream.result()
            text = self.tok.delta(ids, list(output.outputs[0].token_ids))
            return Sample(time.perf_counter() - start, text, 1)
        detok = self.tok.IncrementalDetokenizer(self.tok.tokenizer.decode, ids)
        times, parts = [], []
        for output in stream:
            new = list(output.outputs[0].new_token_ids)
            if new:
                parts.append(detok.push(new))
                times.append(time.perf_counter())
        return Sample(times[-1] - start, "".join(parts), len(times), times[0] - start, _gaps(times))

    def close(self) -> None:
        pass


class HttpGenerate:
    """POST /v2/models/<model>/generate on one keep-alive connection."""

    def __init__(self, host: str, port: int, model: str, prompt: str, max_tokens: int) -> None:
        self.host, self.port = host, port
        self.connection = http.client.HTTPConnection(host, port, timeout=_RESPONSE_TIMEOUT_S)
        self.path = f"/v2/models/{model}/generate"
        self.body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
        self.headers = {"Content-Type": "application/json"}
        self.reconnects = 0

    def request(self) -> Sample:
        try:
            return self._request()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # A kept-alive connection closed by the server: reconnect once, as HTTP clients do
            # with pooled connections (counted in the result; the clock restarts).
            self.connection.close()
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=_RESPONSE_TIMEOUT_S)
            self.reconnects += 1
            return self._request()

    def _request(self) -> Sample:
        start = time.perf_counter()
        self.connection.request("POST", self.path, body=self.body, headers=self.headers)
        response = self.connection.getresponse()
        data = response.read()
        latency = time.perf_counter() - start
        if response.status != 200:
            raise RuntimeError(f"POST {self.path}: HTTP {response.status}: {data[:500]!r}")
        return Sample(latency, json.loads(data)["text_output"], 1)

    def close(self) -> None:
        self.connection.close()  # an open keep-alive connection would hold up the server's shutdown


class GrpcStream:
    """Requests one after another on one open gRPC stream (as a streaming client keeps it)."""

    def __init__(self, url: str, model: str, prompt: str, max_tokens: int, stream: bool) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient

        self.model = model
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((time.perf_counter(), result, error)))
        self.inputs = []
        for name, array, datatype in (
            ("text_input", np.array([[prompt.encode("utf-8")]], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
            ("stream", np.array([[stream]], dtype=np.bool_), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            self.inputs.append(tensor)

    def request(self) -> Sample:
        request_id = uuid.uuid4().hex
        start = time.perf_counter()
        self.client.async_stream_infer(self.model, self.inputs, request_id=request_id, enable_empty_final_response=True)
        times, parts = [], []
        while True:
            arrived, result, error = self.responses.get(timeout=_RESPONSE_TIMEOUT_S)
            if error is not None:
                raise RuntimeError(f"{self.model}: {error}")
            response = result.get_response()
            if response.id != request_id:
                raise RuntimeError(f"{self.model}: a response of request {response.id!r} arrived during {request_id!r}")
            array = result.as_numpy("text_output")
            if array is not None:
                parts.append(array.reshape(-1)[0].decode("utf-8"))
                times.append(arrived)
            if response.parameters["triton_final_response"].bool_param:
                latency = arrived - start
                break
        if not times:
            raise RuntimeError(f"{self.model}: request {request_id} ended without text")
        return Sample(latency, "".join(parts), len(times), times[0] - start, _gaps(times))

    def close(self) -> None:
        try:
            self.client.stop_stream()
        finally:
            self.client.close()


def _gaps(times: list[float]) -> tuple[float, ...]:
    return tuple(later - earlier for earlier, later in zip(times, times[1:]))

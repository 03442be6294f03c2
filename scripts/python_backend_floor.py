"""What NVIDIA's ensemble shape costs on the Python backend with no work in it (issue #18's floor).

Serves, in the real tritonserver, two numpy-only ensembles of Python models on loopback:
  ens3: pre (bytes -> int32 ids) -> mid (decoupled: one response from a relay thread, as the cpu
        `tensorrt_llm` model answers) -> post (ids -> bytes): the shape of preprocessing -> tensorrt_llm ->
        postprocessing without a tokenizer or an engine;
  ens2: pre -> post (the smallest ensemble: two Python steps, no engine between them).
and times HTTP `/generate` one request at a time, interleaved rounds. Run from the repo root:
  .venv/bin/python scripts/python_backend_floor.py [REQUESTS_PER_ROUND] [ROUNDS]
"""

from __future__ import annotations

import http.client
import json
import sys
import tempfile
import time
from pathlib import Path

from pipeline.load.serving import free_ports
from pipeline.serve import ServerOptions, TritonServer

MODELS = {
    "pre": (
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\noutput [ { name: "IDS" data_type: TYPE_INT32 dims: [ 1, -1 ] } ]\n',
        """
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            ids = np.frombuffer(text, dtype=np.uint8).astype(np.int32).reshape(1, -1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IDS", ids)]))
        return responses
""",
    ),
    "mid": (
        "model_transaction_policy { decoupled: true }\n"
        'input [ { name: "IDS" data_type: TYPE_INT32 dims: [ 1, -1 ] } ]\n'
        'output [ { name: "OUT_IDS" data_type: TYPE_INT32 dims: [ 1, -1 ] } ]\n',
        """
import queue
import threading
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        self.work = queue.SimpleQueue()
        threading.Thread(target=self._relay, daemon=True).start()
    def _relay(self):
        while (item := self.work.get()) is not None:
            sender, ids = item
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT_IDS", ids[:, -1:].copy())])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    def execute(self, requests):
        for request in requests:
            self.work.put((request.get_response_sender(), pb_utils.get_input_tensor_by_name(request, "IDS").as_numpy()))
        return None
    def finalize(self):
        self.work.put(None)
""",
    ),
    "post": (
        'input [ { name: "OUT_IDS" data_type: TYPE_INT32 dims: [ 1, -1 ] } ]\noutput [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n',
        """
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "OUT_IDS").as_numpy().reshape(-1)
            text = np.array([bytes(ids.astype(np.uint8))], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT_OUT", text)]))
        return responses
""",
    ),
}
STEP = (
    '{{ model_name: "{model}" model_version: -1 input_map {{ key: "{key_in}" value: "{value_in}" }} output_map {{ key: "{key_out}" value: "{value_out}" }} }}'
)
ENSEMBLES = {
    "ens3": [("pre", "TEXT", "text_input", "IDS", "_ids"), ("mid", "IDS", "_ids", "OUT_IDS", "_out"), ("post", "OUT_IDS", "_out", "TEXT_OUT", "text_output")],
    "ens2": [("pre", "TEXT", "text_input", "IDS", "_ids"), ("post", "OUT_IDS", "_ids", "TEXT_OUT", "text_output")],
}


def write_repository(root: Path) -> None:
    for name, (tensors, code) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{tensors}instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n'
        )
    for name, steps in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)
        rendered = ",\n    ".join(STEP.format(model=m, key_in=ki, value_in=vi, key_out=ko, value_out=vo) for m, ki, vi, ko, vo in steps)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
            'input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
            'output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
            f"ensemble_scheduling {{\n  step [\n    {rendered}\n  ]\n}}\n"
        )


def main(requests: int = 300, rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        repository = Path(scratch) / "repo"
        write_repository(repository)
        http_port, grpc_port, metrics_port = free_ports(3)
        options = ServerOptions(model_repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
        server = TritonServer(options, workspace=Path(scratch) / "serve").start()
        try:
            server.wait_until_ready(timeout=120)
            connection = http.client.HTTPConnection("127.0.0.1", http_port)
            prompt = "def foo(x):\n    return"
            body = json.dumps({"text_input": prompt})
            expected = {"ens3": prompt[-1], "ens2": prompt}  # mid keeps the last id

            def one(model: str) -> float:
                start = time.perf_counter()
                connection.request("POST", f"/v2/models/{model}/generate", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                if response.status != 200 or json.loads(payload)["text_output"] != expected[model]:
                    raise RuntimeError(f"{model}: {response.status} {payload!r}")
                return time.perf_counter() - start

            for model in ENSEMBLES:
                for _ in range(50):
                    one(model)
            for index in range(rounds):
                for model in ENSEMBLES:
                    latencies = sorted(one(model) for _ in range(requests))
                    print(
                        f"round {index} {model}: p50 {latencies[requests // 2] * 1e3:.3f} ms, "
                        f"p90 {latencies[requests * 9 // 10] * 1e3:.3f} ms (1-min load {open('/proc/loadavg').read().split()[0]})"
                    )
            connection.close()
        finally:
            print(f"tritonserver exit code {server.stop()}")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))

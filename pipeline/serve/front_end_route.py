"""Which Triton model the OpenAI front end calls when `--triton-model` does not say: the ensemble
(`serve.model_name`), on every Triton.

Why not the BLS (`tensorrt_llm_bls`): it serves each request on a thread of its own, and with many
decoupled calls in flight in one stub Triton's Python backend deadlocks (python_backend r24.10, the
bundled 2.51, and unchanged on its main branch at f9088ff). A BLS thread whose `exec(decoupled=True)`
returns looks its response iterator up (`Stub::GetResponseIterator`) under the stub's iterator-map mutex
while holding the GIL; the stub's one thread for server messages (`ProcessBLSResponseDecoupled`) holds
that mutex while it queues a response into another call's iterator, for which it needs that iterator's
mutex; and the thread reading that call (`ResponseIterator::Next`), woken by its previous response, holds
the iterator mutex while it takes the GIL back. `bench soak` on the cpu target stopped there after 9
minutes of 64 streams, half of them cut (every stack in BENCHMARKS.md, "Soak ... issue #48"); through
the ensemble the same 30 minutes failed no request and kept memory flat (exit 1 at stop remains). The ensemble's own 2.51 faults were
under gRPC cancellation of its streams (docs/serving.md); the front end ends an ensemble stream by
TensorRT-LLM's `stop` request instead, so it never cancels one.
"""

from __future__ import annotations

BLS_MODEL = "tensorrt_llm_bls"


def front_end_triton_model(ensemble: str) -> str:
    """The Triton model the front end calls by default: the ensemble named `ensemble`."""
    return ensemble


def triton_version(grpc_url: str, timeout_s: float = 5.0) -> str | None:
    """The server version Triton at `grpc_url` reports (server metadata, open in hardened deployments), or None."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(grpc_url)
    except InferenceServerException:
        return None
    try:
        return client.get_server_metadata(client_timeout=timeout_s).version or None
    except InferenceServerException:
        return None
    finally:
        client.close()

"""Small helpers over `triton_python_backend_utils` shared by the Python models.

Inside Triton's stub only: the module imports `triton_python_backend_utils`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class BadRequest(ValueError):
    """A request the model refuses; answered with an INVALID_ARG error, the server stays up."""


def input_arrays(request: Any, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The request's inputs by name (only `names`, if given), in one pass over them:
    `pb_utils.get_input_tensor_by_name` walks the whole input list on every call."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs() if names is None or tensor.name() in names}


def required_array(arrays: Mapping[str, np.ndarray], name: str, client_name: str | None = None) -> np.ndarray:
    array = arrays.get(name)
    if array is None:
        raise BadRequest(f"input {client_name or name!r} is required")
    return array


def optional_input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def required_input(request: Any, name: str, client_name: str | None = None) -> np.ndarray:
    return required_array({name: array} if (array := optional_input(request, name)) is not None else {}, name, client_name)


def batch_size_of(array: np.ndarray, name: str) -> int:
    if array.ndim == 0 or array.shape[0] < 1:
        raise BadRequest(f"input {name!r} has shape {list(array.shape)}; expected a batch dimension of at least 1")
    return int(array.shape[0])


def scalar_per_row(array: np.ndarray | None, batch_size: int, name: str) -> list[Any] | None:
    """One value per batch row from a `[B]` or `[B, 1]` tensor (None if the input is absent)."""
    if array is None:
        return None
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    if flat.shape[0] != batch_size or flat.shape[1] != 1:
        raise BadRequest(f"input {name!r} must hold one value per request row, got shape {list(array.shape)}")
    return [value.item() if hasattr(value, "item") else value for value in flat[:, 0]]


def as_text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadRequest(f"input {name!r} is not valid UTF-8 ({error.reason} at byte {error.start})") from None
    if isinstance(value, str):
        return value
    raise BadRequest(f"input {name!r} must be a string, got {type(value).__name__}")


def error_response(message: str, code: Any = None) -> Any:
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


def string_tensor(name: str, texts: Iterable[str]) -> Any:
    """A flat STRING tensor, shape [len(texts)]."""
    return pb_utils.Tensor(name, np.array([text.encode("utf-8") for text in texts], dtype=np.object_))


def requested_outputs(request: Any) -> frozenset[str]:
    return frozenset(request.requested_output_names())


def arrays_response(arrays: Mapping[str, np.ndarray], requested: Collection[str]) -> Any:
    """A response holding only the `requested` outputs (what Triton would deliver anyway).

    Why not let Triton drop the others: in a decoupled model the Python backend of Triton 2.51
    prunes unrequested outputs inside `response_sender.send()` after releasing the GIL, so their
    numpy arrays are freed without it and the stub's heap is corrupted under concurrency (the
    stub dies with SIGSEGV or "malloc(): unaligned fastbin chunk"). Fixed in python_backend
    r24.12 (#390, "Hold GIL when deleting numpy array"); the bundled server is r24.10.
    """
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, array) for name, array in arrays.items() if name in requested])


def answer_each(requests: Iterable[Any], accept: Callable[[Any, Any], None], *, refusals: type[Exception], model: str, channel: Callable[[Any], Any]) -> None:
    """A decoupled model's `execute`: each request gets its response channel (`channel(request)`, a
    response_channel.ResponseChannel over its sender) and `accept(request, channel)`; a refusal (`refusals`) is
    answered INVALID_ARG with its message, anything else INTERNAL and logged, and the model keeps serving."""
    for request in requests:
        sender = channel(request)
        try:
            accept(request, sender)
        except refusals as error:
            sender.send(error_response(str(error)), final=True)
        except Exception as error:  # never let one request take the model down
            log_error(f"{model}: request failed: {type(error).__name__}: {error}")
            sender.send(error_response(f"request failed: {error}", pb_utils.TritonError.INTERNAL), final=True)
    return None


def send_stop(model_name: str, request_id: str, *, keep: Callable[[Any], None]) -> list[str]:
    """TensorRT-LLM's cancellation: a `stop` request to the LLM model for the in-flight requests with
    `request_id`; the error messages of its responses. The decoupled call's response iterator goes to
    `keep` (a DeferredRelease's `hold`: the stub must let go of it first, see deferred_release.py)."""
    stop = pb_utils.InferenceRequest(
        model_name=model_name,
        requested_output_names=[],
        inputs=[
            pb_utils.Tensor("stop", np.array([[True]], dtype=np.bool_)),
            pb_utils.Tensor("input_lengths", np.array([[0]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.array([[1]], dtype=np.int32)),
        ],
        request_id=request_id,
    )
    responses = stop.exec(decoupled=True)
    try:
        return [response.error().message() for response in responses if response.has_error()]
    finally:
        keep(responses)


def log_error(message: str) -> None:
    pb_utils.Logger.log_error(message)


def log_warning(message: str) -> None:
    pb_utils.Logger.log_warn(message)

"""The FastAPI application: `/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/health`.

Requests are read and parsed here (not by FastAPI's body handling) so that every refusal has
OpenAI's error shape and status: a body over `max_body_bytes` is 413, malformed JSON and wrong
types are 400 (FastAPI would answer 422). A streamed answer waits for its first event before
sending headers, so a request Triton refuses, or an unreachable Triton (503), still gets its
status code; later errors go into the stream. A client that goes away, streaming or not, cancels
its Triton requests at once, which frees their KV-cache blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from clients.aio import AsyncTritonLLMClient
from clients.errors import ClientError
from clients.openai_server import errors
from clients.openai_server.defaults import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_N, DEFAULT_REQUEST_TIMEOUT_S
from clients.openai_server.errors import OpenAIError
from clients.openai_server.generation import ChoiceEvent, OpenStreams, collect, merged
from clients.openai_server.model import ServedModel
from clients.openai_server.planning import Context, Plan, plan_chat, plan_completion
from clients.openai_server.responses import DONE, Answer, sse
from clients.openai_server.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from clients.openai_server.tokenizer import PromptTokenizer

_DRAIN_LIMIT_BYTES = 64 << 20  # a refused body is read (and dropped) up to this size, so the client sees the 413
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class ServerSettings:
    """Everything the app needs: where Triton listens (gRPC host:port) and what it serves."""

    triton_url: str
    model: ServedModel
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_n: int = DEFAULT_MAX_N
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S
    triton_retries: int = 2


class _ClientGone(Exception):
    pass


def create_app(settings: ServerSettings, *, tokenizer: PromptTokenizer | None = None) -> FastAPI:
    tokenizer = tokenizer or PromptTokenizer(settings.model.tokenizer_dir, add_special_tokens=settings.model.add_special_tokens)
    context = Context(settings.model, tokenizer, settings.max_n)
    card = ModelCard(id=settings.model.name, created=int(time.time()))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.triton = AsyncTritonLLMClient(
            settings.triton_url, "grpc", settings.model.triton_model, timeout=settings.request_timeout_s, retries=settings.triton_retries
        )
        try:
            yield
        finally:
            await app.state.triton.close()  # cancels what is still running

    app = FastAPI(title="trtllm-pipeline OpenAI-compatible API", lifespan=lifespan)
    _add_error_handlers(app)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return ModelList(data=[card]).model_dump(mode="json")

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id != card.id:
            raise errors.model_not_found(model_id)
        return card.model_dump(mode="json")

    @app.get("/health")
    async def health(request: Request) -> dict[str, str]:
        if not await request.app.state.triton.is_ready():
            raise OpenAIError(503, f"Triton at {settings.triton_url} is not ready to serve {settings.model.triton_model!r}", type=errors.UNAVAILABLE)
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        parsed = _parse(CompletionRequest, await _read_body(request, settings.max_body_bytes))
        return await _answer(request, plan_completion(parsed, context), settings.model.name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        parsed = _parse(ChatCompletionRequest, await _read_body(request, settings.max_body_bytes))
        return await _answer(request, plan_chat(parsed, context), settings.model.name, chat=True)

    return app


async def _answer(request: Request, plan: Plan, model_name: str, *, chat: bool) -> Response:
    answer = Answer(plan, model_name, chat=chat)
    streams = OpenStreams()
    events = merged(request.app.state.triton, plan.choices, streams)
    try:
        if not plan.stream:
            results = await _until_disconnected(request, collect(events, len(plan.choices)))
            return JSONResponse(answer.body(results))
        first = await _until_disconnected(request, anext(events))
    except ClientError as error:
        streams.cancel()
        raise errors.from_client_error(error) from None
    except _ClientGone:
        streams.cancel()
        return Response(status_code=499)  # nobody reads it
    return StreamingResponse(_stream(answer, first, events, streams), media_type="text/event-stream", headers=SSE_HEADERS)


async def _stream(answer: Answer, first: ChoiceEvent, events: AsyncIterator[ChoiceEvent], streams: OpenStreams) -> AsyncIterator[bytes]:
    try:
        for chunk in answer.chunks(first):
            yield chunk
        async for event in events:
            for chunk in answer.chunks(event):
                yield chunk
        for chunk in answer.closing():
            yield chunk
    except ClientError as error:
        yield sse(errors.from_client_error(error).body())
        yield DONE
    finally:
        streams.cancel()  # synchronous: the client may be gone and this task cancelled


async def _until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or _ClientGone (and `work` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise _ClientGone
    finally:
        watcher.cancel()
        task.cancel()  # a no-op once done


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            too_large = True
        if too_large:
            if size > _DRAIN_LIMIT_BYTES:
                break
            continue
        parts.append(part)
    if too_large:
        raise errors.body_too_large(limit)
    return b"".join(parts)


def _parse(schema: type[M], body: bytes) -> M:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise errors.bad_request(f"We could not parse the JSON body of your request: {error}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise errors.bad_request(f"The request body must be a JSON object, not {type(payload).__name__}.", code="invalid_json")
    try:
        return schema.model_validate_json(body)
    except ValidationError as error:
        raise errors.from_validation_error(error) from None


def _add_error_handlers(app: FastAPI) -> None:
    def as_json(error: OpenAIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return as_json(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}."
            return as_json(OpenAIError(404, message, code="unknown_url"))
        return as_json(OpenAIError(error.status_code, str(error.detail), type=errors.INVALID_REQUEST if error.status_code < 500 else errors.SERVER_ERROR))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return as_json(OpenAIError(500, f"The server failed: {type(error).__name__}: {error}", type=errors.SERVER_ERROR))

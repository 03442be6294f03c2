"""The FastAPI application: `/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/health`, `/metrics`
(time to first token, inter-token latency and request counts, `metrics`); with API keys, `access` guards `/v1/*`.

Requests are read and parsed by `bodies` (not by FastAPI's body handling) so that every refusal
has OpenAI's error shape and status: a body over `max_body_bytes` is 413; malformed JSON, a body
nesting deeper than `max_json_depth`, and wrong types are 400 (FastAPI would answer 422).
`/openapi.json` still documents every body and answer (`openapi`). A streamed answer waits for
its first event before sending headers, so a request Triton refuses, or an unreachable Triton
(503), still gets its status code; later errors go into the stream. A client that goes away,
streaming or not, ends its Triton requests at once, which frees their KV-cache blocks: on an
ensemble by a `stop` to its LLM model (clients/aio_stop.py: a cancelled call is not stopped when
postprocessing is batched), on the BLS by cancelling the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clients.aio import AsyncTritonLLMClient
from clients.errors import ClientError
from clients.lora import LoraAdapter
from clients.openai_server import access, errors, openapi, routes
from clients.openai_server.access import KEY_NAME_STATE, NO_KEY, AccessPolicy, key_name
from clients.openai_server.admission import DEFAULT_ADMISSION_CAPACITY, ClassAdmission
from clients.openai_server.bodies import parse, read_body
from clients.openai_server.defaults import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_N, DEFAULT_REQUEST_TIMEOUT_S
from clients.openai_server.errors import OpenAIError
from clients.openai_server.generation import ChoiceEvent, OpenStreams, Route, collect, merged
from clients.openai_server.guided import in_request_terms
from clients.openai_server.metrics import CONTENT_TYPE, FrontEndMetrics, timed
from clients.openai_server.model import ServedModel
from clients.openai_server.planning import Context, Plan, plan_chat, plan_completion
from clients.openai_server.responses import DONE, Answer, sse
from clients.openai_server.schemas import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, Health, ModelCard, ModelList
from clients.openai_server.tokenizer import PromptTokenizer

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
STREAM_DOC = 'server-sent events `data: <chunk JSON>`, then `data: [DONE]`; an error after the first event is one `data: {"error": …}` event.'
T = TypeVar("T")


@dataclass(frozen=True)
class ServerSettings:
    """Everything the app needs: where Triton listens (gRPC host:port) and what it serves.
    `max_body_bytes`: larger bodies get 413; `max_json_depth`: bodies whose arrays/objects nest
    deeper get 400 `json_too_deep`; `max_n`: most choices (n × prompts) per request; `access`: API keys and
    per-key limits (none by default)."""

    triton_url: str
    model: ServedModel
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_n: int = DEFAULT_MAX_N
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S
    triton_retries: int = 2
    access: AccessPolicy = field(default_factory=AccessPolicy)
    adapters: Mapping[str, LoraAdapter] = field(default_factory=dict)  # LoRA adapters by the name clients pass as `model`

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth", "max_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.model.name in self.adapters:
            raise ValueError(f"LoRA adapter name {self.model.name!r} is the served model's name; give the adapter another")
        if self.model.traffic is not None:
            self.model.traffic.check_key_names(self.access.keys.names if self.access.keys is not None else ())


class _ClientGone(Exception):
    pass


def create_app(settings: ServerSettings, *, tokenizer: PromptTokenizer | None = None) -> FastAPI:
    tokenizer = tokenizer or PromptTokenizer(settings.model.tokenizer_dir, add_special_tokens=settings.model.add_special_tokens)
    context = Context(settings.model, tokenizer, settings.max_n, settings.adapters)
    created = int(time.time())
    cards = {
        card.id: card
        for card in [ModelCard(id=settings.model.name, created=created, root=settings.model.name)]
        + [
            ModelCard(id=name, created=created, root=name, parent=settings.model.name)
            for name in settings.adapters  # as vLLM lists them
        ]
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = getattr(app.state, "triton", None) is None  # tests may set a scripted client before starting
        if own:
            app.state.triton = AsyncTritonLLMClient(
                settings.triton_url,
                "grpc",
                settings.model.triton_model,
                timeout=settings.request_timeout_s,
                retries=settings.triton_retries,
                stop_model=settings.model.llm_model if settings.model.ensemble else None,  # clients/aio_stop.py
            )
        try:
            yield
        finally:
            await app.state.triton.close()  # cancels what is still running
            if own:
                app.state.triton = None  # a later startup makes a new one

    app = FastAPI(title="trtllm-pipeline OpenAI-compatible API", lifespan=lifespan)
    app.state.metrics = FrontEndMetrics(keyed=settings.access.keys is not None, classed=settings.model.traffic is not None)
    traffic = settings.model.traffic
    app.state.admission = ClassAdmission(traffic, settings.model.max_batch_size or DEFAULT_ADMISSION_CAPACITY) if traffic is not None else None
    _add_error_handlers(app)
    access.install(app, settings.access)
    _count_answers(app)  # after access: outside it, so its 401s and 429s are counted too
    openapi.install(app, (CompletionRequest, ChatCompletionRequest), context, settings.access)

    @app.get(routes.MODELS, response_model=None, responses=openapi.answers(ModelList, "The served model."))
    async def list_models() -> dict[str, Any]:
        return ModelList(data=list(cards.values())).model_dump(mode="json")

    @app.get(routes.MODELS + "/{model_id:path}", response_model=None, responses=openapi.answers(ModelCard, "The served model.", 404))
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in cards:
            raise errors.model_not_found(model_id, tuple(cards))
        return cards[model_id].model_dump(mode="json")

    @app.get(routes.HEALTH, response_model=None, responses=openapi.answers(Health, "Triton is ready to serve the model.", 503))
    async def health(request: Request) -> dict[str, str]:
        if not await request.app.state.triton.is_ready():
            raise OpenAIError(503, f"Triton at {settings.triton_url} is not ready to serve {settings.model.triton_model!r}", type=errors.UNAVAILABLE)
        return {"status": "ok"}

    @app.get(routes.METRICS, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post(
        routes.COMPLETIONS,
        openapi_extra=openapi.request_body(CompletionRequest),
        responses=openapi.answers(Completion, "The completion.", *openapi.GENERATION_ERRORS, stream=STREAM_DOC),
    )
    async def completions(request: Request) -> Response:
        parsed = parse(CompletionRequest, await read_body(request, settings.max_body_bytes), max_depth=settings.max_json_depth)
        return await _answer(request, plan_completion(parsed, context, key_name(request)), context, chat=False)

    @app.post(
        routes.CHAT_COMPLETIONS,
        openapi_extra=openapi.request_body(ChatCompletionRequest),
        responses=openapi.answers(ChatCompletion, "The chat completion.", *openapi.GENERATION_ERRORS, stream=STREAM_DOC),
    )
    async def chat_completions(request: Request) -> Response:
        parsed = parse(ChatCompletionRequest, await read_body(request, settings.max_body_bytes), max_depth=settings.max_json_depth)
        return await _answer(request, plan_chat(parsed, context, key_name(request)), context, chat=True)

    return app


async def _answer(request: Request, plan: Plan, context: Context, *, chat: bool) -> Response:
    traffic_class, admission = plan.traffic_class, request.app.state.admission
    try:
        slot = await _until_disconnected(request, admission.acquire(traffic_class)) if traffic_class is not None else None
    except _ClientGone:
        return Response(status_code=499)  # gone while queued: nothing was sent to Triton
    release = slot.release if slot is not None else lambda: None
    answer = Answer(plan, plan.model_name or context.model.name, chat=chat)
    streams = OpenStreams()
    route = Route(request.app.state.triton, context.tokenizer, context.model.llm_model)
    events = timed(merged(route, plan.choices, streams), request.app.state.metrics, request.state.received, traffic_class)
    try:
        if not plan.stream:
            try:
                results = await _until_disconnected(request, collect(events, len(plan.choices)))
            finally:
                release()
            return JSONResponse(answer.body(results))
        first = await _until_disconnected(request, anext(events))
    except ClientError as error:
        streams.cancel()
        release()
        raise in_request_terms(errors.from_client_error(error), plan.guide_param) from None
    except _ClientGone:
        streams.cancel()
        release()
        return Response(status_code=499)  # nobody reads it
    except BaseException:
        release()
        raise
    return StreamingResponse(_stream(answer, first, events, streams, plan.guide_param, release), media_type="text/event-stream", headers=SSE_HEADERS)


async def _stream(
    answer: Answer,
    first: ChoiceEvent,
    events: AsyncIterator[ChoiceEvent],
    streams: OpenStreams,
    guide_param: str | None,
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    try:
        for chunk in answer.chunks(first):
            yield chunk
        async for event in events:
            for chunk in answer.chunks(event):
                yield chunk
        for chunk in answer.closing():
            yield chunk
    except ClientError as error:
        yield sse(in_request_terms(errors.from_client_error(error), guide_param).body())
        yield DONE
    finally:
        streams.cancel()  # synchronous: the client may be gone and this task cancelled
        release()  # its admission slot (admission.py), if it holds one


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


def _count_answers(app: FastAPI) -> None:
    """Every `/v1/*` request's status (and with keys, its key's name) into the metrics, and `received`, the clock
    TTFT counts from. A plain ASGI middleware: it only watches `send`, so streaming and disconnect detection are untouched."""
    metrics: FrontEndMetrics = app.state.metrics

    class CountAnswers:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not scope["path"].startswith(routes.API_PREFIX):
                await self.inner(scope, receive, send)
                return
            state = scope.setdefault("state", {})
            state["received"] = time.monotonic()

            async def watch(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    metrics.count_request(routes.endpoint_label(scope["path"]), message["status"], state.get(KEY_NAME_STATE, NO_KEY))
                await send(message)

            await self.inner(scope, receive, watch)

    app.add_middleware(CountAnswers)


def _add_error_handlers(app: FastAPI) -> None:
    def as_json(error: OpenAIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        return as_json(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}."
            return as_json(OpenAIError(404, message, code="unknown_url"))
        if error.status_code == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}; allowed: {(error.headers or {}).get('Allow', 'none')}."
            response = as_json(OpenAIError(405, message, code="method_not_allowed"))
        else:
            kind = errors.INVALID_REQUEST if error.status_code < 500 else errors.SERVER_ERROR
            response = as_json(OpenAIError(error.status_code, str(error.detail), type=kind))
        response.headers.update(error.headers or {})  # e.g. a 405's Allow
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_parameters(request: Request, error: RequestValidationError) -> JSONResponse:
        return as_json(errors.bad_request(f"Invalid request: {error.errors()[0].get('msg', error)}"))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return as_json(OpenAIError(500, f"The server failed: {type(error).__name__}: {error}", type=errors.SERVER_ERROR))

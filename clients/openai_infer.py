"""`infer --protocol openai`: one prompt to an OpenAI-compatible server's `/v1/completions` (the project's front end,
or any server of that API), streamed or not, sending `Authorization: Bearer KEY` when given a key.

The served model's name is `model`, else the only one `/v1/models` lists. Sampling and guides are sent under the
names the front end (and vLLM) read: `top_k`, `seed`, `stop`, `guided_json` / `guided_regex` / `guided_grammar`.
An HTTP error is a RequestError carrying the server's status and message; no connection, a ServerUnavailableError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from clients.api_keys import bearer_headers
from clients.errors import ClientError, ClientTimeoutError, InvalidRequestError, ProtocolError, RequestError, ServerUnavailableError
from clients.sse import openai_events

# The guided_decoding_guide_type values clients.cli builds, as the front end's request fields.
GUIDE_FIELDS = {"json_schema": "guided_json", "regex": "guided_regex", "ebnf_grammar": "guided_grammar"}
KEY_HINT = "send a key with --api-key-file FILE or the TRTLLM_PIPELINE_API_KEYS variable"


@dataclass(frozen=True)
class OpenAICompletion:
    text: str
    latency_s: float


def complete(
    base_url: str,
    prompt: str,
    *,
    model: str | None,
    api_key: str | None,
    max_tokens: int,
    sampling: dict[str, Any],
    stream: bool = False,
    timeout: float = 60.0,
    on_text: Callable[[str], None] = lambda text: None,
) -> OpenAICompletion:
    """One completion; with `stream`, `on_text` gets each piece of text as it arrives."""
    if sampling.get("beam_width") is not None:
        raise InvalidRequestError("beam_width", "beam search is not part of the OpenAI API: use --protocol grpc or http for --beam-width")
    base = base_url.rstrip("/") if base_url.rstrip("/").endswith("/v1") else base_url.rstrip("/") + "/v1"
    headers = bearer_headers(api_key)
    started = time.monotonic()
    try:
        text = asyncio.run(_text(base, headers, timeout, prompt, model, max_tokens, sampling, stream, on_text))
    except ClientError:  # what this module raised itself (InvalidRequestError is a ValueError too)
        raise
    except httpx.TimeoutException:
        raise ClientTimeoutError(timeout, f"from {base}") from None
    except httpx.TransportError as error:
        raise ServerUnavailableError(base, str(error) or type(error).__name__) from None
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise ProtocolError(f"{base} did not answer as the OpenAI API does: {error}") from None
    return OpenAICompletion(text, time.monotonic() - started)


async def _text(
    base: str,
    headers: dict[str, str],
    timeout: float,
    prompt: str,
    model: str | None,
    max_tokens: int,
    sampling: dict[str, Any],
    stream: bool,
    on_text: Callable[[str], None],
) -> str:
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout) as http:
        body = {"model": model or await _only_model(http), "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **_fields(sampling)}
        if not stream:
            text: str = (await _checked(await http.post("/completions", json=body))).json()["choices"][0]["text"]
            return text
        pieces = []
        async with http.stream("POST", "/completions", json=body) as response:
            await _checked(response)
            async for event in openai_events(response.aiter_lines()):
                for choice in event.get("choices") or ():
                    pieces.append(choice.get("text") or "")
                    on_text(pieces[-1])
        return "".join(pieces)


def _fields(sampling: dict[str, Any]) -> dict[str, Any]:
    fields = {name: sampling[name] for name in ("temperature", "top_k", "top_p", "seed", "stop", "service_tier") if sampling.get(name) is not None}
    guide_type = sampling.get("guided_decoding_guide_type")
    if guide_type is not None:
        fields[GUIDE_FIELDS[guide_type]] = sampling["guided_decoding_guide"]
    return fields


async def _only_model(http: httpx.AsyncClient) -> str:
    served: list[str] = [model["id"] for model in (await _checked(await http.get("/models"))).json()["data"]]
    if len(served) != 1:
        raise InvalidRequestError("model", f"{http.base_url}/models serves {', '.join(served) or 'no model'}: name one with --model")
    return served[0]


async def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    await response.aread()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    if response.status_code == 401:
        message = f"{message} ({KEY_HINT})"
    raise RequestError(response.status_code, message)

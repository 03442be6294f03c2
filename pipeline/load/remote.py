"""The endpoints of a running deployment given by URL (`bench load --url`, gate.performance.url), for either contract:

- grpc|http: Triton; a target in NVIDIA's llmapi layout serves its one model `tensorrt_llm` with NVIDIA's tensor names
  (clients.load.llmapi_target, http only), every other target the ensemble.
- openai: the project's front end (it serves the build name) or trtllm-serve, which serves the name of its model
  directory (`engine`: OpenAIServer takes `Path(model).name`). The served name is read from `GET /v1/models`: the
  build name when it is listed, else the one model listed. With an API key, that request and the load carry it.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from clients.api_keys import ApiKey, ApiKeyError, bearer_headers, given_api_keys
from pipeline.backends.registry import backend_for
from pipeline.config.spec import Spec
from pipeline.errors import SpecError
from pipeline.load.sweep import Endpoints

MODELS_TIMEOUT_S = 10.0


def remote_endpoints(spec: Spec, endpoint: str, url: str, *, api_key: str | None = None) -> Endpoints:
    contract = "llmapi" if backend_for(spec.build.target).llm_api is not None else "ensemble"
    if contract == "llmapi" and endpoint == "grpc":
        raise SpecError(
            f"build.target {spec.build.target.value} serves NVIDIA's llmapi model, measured over http (its generate_stream): "
            "use the http endpoint, or openai against trtllm-serve"
        )
    model_name = served_model(url, spec.name, api_key) if endpoint == "openai" else spec.name
    return Endpoints(**{endpoint: url}, model_name=model_name, triton_contract=contract, api_key=api_key)


def load_test_keys(key_file: Path | None) -> tuple[ApiKey, ...] | None:
    """The API keys a load test sends the first of (and a front end it starts asks for): `key_file`'s, else those of
    TRTLLM_PIPELINE_API_KEYS, else none. An unusable file or variable is a SpecError naming its line, never a key."""
    try:
        return given_api_keys(key_file)
    except ApiKeyError as error:
        raise SpecError(str(error), hint="KEY or NAME:KEY per line, keys of at least 16 characters (docs/api-keys.md)") from None


def served_model(base_url: str, build_name: str, api_key: str | None = None) -> str:
    """The model name an OpenAI-compatible server at `base_url` serves: `build_name` if listed, else its only model."""
    base = base_url.rstrip("/")
    models_url = f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"
    try:
        response = httpx.get(models_url, timeout=MODELS_TIMEOUT_S, headers=bearer_headers(api_key))
        response.raise_for_status()
        served = [model["id"] for model in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        raise SpecError(f"cannot list the models served at {models_url}: {error}", hint="is the OpenAI-compatible server up?") from None
    if build_name in served:
        return build_name
    if len(served) == 1:
        return served[0]
    raise SpecError(f"{models_url} serves {', '.join(served) or 'no model'}, not {build_name!r}: which one to measure is ambiguous")

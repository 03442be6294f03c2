"""The API's paths, and the bounded set of `endpoint` labels the metrics count requests under (a client
choosing the URL must not choose the number of series)."""

from __future__ import annotations

API_PREFIX = "/v1/"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
MODELS = "/v1/models"
MODEL = "/v1/models/{model_id}"
GENERATION_PATHS = (COMPLETIONS, CHAT_COMPLETIONS)
HEALTH = "/health"
METRICS = "/metrics"
OTHER = "other"


def endpoint_label(path: str) -> str:
    if path in GENERATION_PATHS or path == MODELS:
        return path
    return MODEL if path.startswith(f"{MODELS}/") else OTHER

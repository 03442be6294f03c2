"""The OpenAI front end's /metrics: TTFT and inter-token histograms from real token timing, request counts."""

from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from clients.openai_server import ServedModel, ServerSettings, create_app
from clients.openai_server.metrics import ITL, REQUESTS, TTFT, FrontEndMetrics
from clients.openai_server.tokenizer import PromptTokenizer

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib-llama"
MODEL = ServedModel(name="tiny", tokenizer_dir=TOKENIZER_DIR, max_seq_len=64, max_input_len=48)
FIRST_TOKEN_S, TOKEN_GAP_S = 0.06, 0.03


class PacedStream:
    """A Triton stream whose first token comes after FIRST_TOKEN_S and every next one TOKEN_GAP_S later."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.tokens_received, self.cancelled = tokens, 0, False

    def __aiter__(self):
        return self._deltas()

    async def _deltas(self):
        for index in range(self.tokens):
            await asyncio.sleep(FIRST_TOKEN_S if index == 0 else TOKEN_GAP_S)
            self.tokens_received += 1
            yield " w"

    @property
    def log_probs_received(self):
        return (-0.5,) * self.tokens_received

    def cancel(self):
        self.cancelled = True


class PacedTriton:
    url = "127.0.0.1:1"

    def stream_request(self, request):
        return PacedStream(request.max_tokens)

    async def is_ready(self):
        return True

    async def close(self):
        pass


def samples(text: str, name: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(_bucket\{{le=\"([^\"]+)\"\}}|_sum|_count|\{{[^}}]*\}}|) (\S+)", line)
        if match:
            found[match.group(2) or match.group(1).lstrip("_")] = float(match.group(3))
    return found


@pytest.fixture(scope="module")
def served() -> tuple[str, float]:
    """/metrics after the requests, and the seconds the requests took in all: no choice's time can exceed that,
    however loaded the machine (a bound that needs no guess)."""
    app = create_app(ServerSettings("127.0.0.1:1", MODEL), tokenizer=PromptTokenizer(TOKENIZER_DIR))
    with TestClient(app) as client:
        app.state.triton = PacedTriton()
        started = time.monotonic()
        streamed = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4, "stream": True})
        assert streamed.status_code == 200, streamed.text
        whole = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "n": 2})
        assert whole.status_code == 200, whole.text
        elapsed = time.monotonic() - started
        assert client.post("/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
        response = client.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        return response.text, elapsed


@pytest.fixture(scope="module")
def metrics_text(served) -> str:
    return served[0]


def test_first_token_time_is_observed_once_per_choice_streamed_or_not(served):
    metrics_text, elapsed = served
    ttft = samples(metrics_text, TTFT)
    assert ttft["count"] == 3  # one streamed choice, two non-streamed choices
    assert ttft["0.05"] == 0 and ttft["+Inf"] == 3  # each waited FIRST_TOKEN_S (0.06 s) at least
    assert FIRST_TOKEN_S * 3 <= ttft["sum"] <= 3 * elapsed  # each choice's first token came within the requests' time


def test_inter_token_latency_is_observed_per_token_after_the_first(served):
    metrics_text, elapsed = served
    itl = samples(metrics_text, ITL)
    assert itl["count"] == 3 + 2 * 2  # (4 - 1) + 2 choices × (3 - 1)
    assert itl["0.025"] == 0  # every gap slept TOKEN_GAP_S (0.03 s)
    assert TOKEN_GAP_S * 7 <= itl["sum"] <= 3 * elapsed  # each choice's gaps lie within the requests' time


def test_requests_are_counted_by_endpoint_and_status(metrics_text):
    assert f'{REQUESTS}{{endpoint="/v1/completions",status="200"}} 1' in metrics_text
    assert f'{REQUESTS}{{endpoint="/v1/chat/completions",status="200"}} 1' in metrics_text
    assert f'{REQUESTS}{{endpoint="/v1/completions",status="404"}} 1' in metrics_text


def test_a_gap_over_several_tokens_is_observed_once_per_token_and_nothing_else_is_exported():
    metrics = FrontEndMetrics()
    metrics.observe_gap(0.09, 3)  # three tokens in one response, 90 ms after the previous one: 30 ms each
    itl = samples(metrics.exposition(), ITL)
    assert itl["count"] == 3 and itl["0.025"] == 0 and itl["0.05"] == 3 and math.isclose(itl["sum"], 0.09)
    text = metrics.exposition()
    assert {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")} == {TTFT, ITL, REQUESTS}
    assert "_created" not in text  # nor the process / platform collectors of the default registry

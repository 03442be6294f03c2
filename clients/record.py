"""What a stream has received so far, assembled into its `Completion` once the final response arrived."""

from __future__ import annotations

import time

from clients.types import Chunk, Completion


class Recorder:
    """The parts of a Completion seen so far."""

    def __init__(self, protocol: str, max_tokens: int | None, whole_beams: bool = False) -> None:
        self.protocol = protocol
        self.max_tokens = max_tokens
        self.whole_beams = whole_beams  # streamed beam search: each response holds every beam whole and replaces the last
        self.started = time.monotonic()
        self.first_response: float | None = None
        self.texts: list[str] = []
        self.responses = 0
        self.tokens: int | None = 0
        self.cum_log_prob: float | None = None
        self.log_probs: list[float] = []
        self.beams: tuple[str, ...] = ()
        self.beam_cum_log_probs: tuple[float, ...] = ()
        self.completion: Completion | None = None

    def add(self, chunk: Chunk) -> None:
        if self.first_response is None:
            self.first_response = time.monotonic() - self.started
        self.responses += 1
        if self.whole_beams:
            if chunk.text or chunk.beams:  # not the empty final response
                self.texts = [chunk.text]
                self.beams = beam_texts(chunk)
                self.beam_cum_log_probs = chunk.beam_cum_log_probs or (() if chunk.cum_log_prob is None else (chunk.cum_log_prob,))
            self.tokens = None
            return
        self.texts.append(chunk.text)
        self.tokens = None if self.tokens is None or chunk.num_tokens is None else self.tokens + chunk.num_tokens
        if chunk.cum_log_prob is not None:
            self.cum_log_prob = chunk.cum_log_prob
        if chunk.log_probs:
            self.log_probs.extend(chunk.log_probs)
        if chunk.beams:
            self.beams, self.beam_cum_log_probs = chunk.beams, chunk.beam_cum_log_probs

    def finish(self) -> Completion:
        tokens = self.tokens if self.responses else None
        reason = None
        if tokens is not None and self.max_tokens is not None:
            reason = "length" if tokens >= self.max_tokens else "stop"
        self.completion = Completion(
            text="".join(self.texts),
            latency_s=time.monotonic() - self.started,
            time_to_first_response_s=self.first_response,
            num_responses=self.responses,
            num_tokens=tokens,
            cum_log_prob=self.cum_log_prob,
            finish_reason=None if self.beams else reason,
            protocol=self.protocol,
            beams=self.beams,
            beam_cum_log_probs=self.beam_cum_log_probs,
        )
        return self.completion


def beam_texts(chunk: Chunk) -> tuple[str, ...]:
    """Every returned beam's text in a beam-search response, best first (one beam: its `text`)."""
    return chunk.beams or ((chunk.text,) if chunk.text else ())


def delta_text(chunk: Chunk) -> str:
    return chunk.text

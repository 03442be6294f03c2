"""`GuidedDecoder`: compiles guides into grammars, once per distinct (guide type, guide).

A request's guide is compiled (or found in the cache) in `LLMEngine.add_request`, before the request
is queued, so a guide xgrammar rejects is a refused request (`InvalidRequestError` naming
`guided_decoding_guide`), never a failed generation. The cache is an LRU bounded by entry count:
a compiled grammar holds per-token-state tables of up to a few MB.

JSON is generated compact (`any_whitespace=False`: `{"a":1}`): free whitespace lets a model that
has not learnt JSON spend its whole token budget on blanks between tokens; the output is the same
JSON value either way.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from refengine.errors import InvalidRequestError
from refengine.guided.params import GUIDE_FIELD, GuidedDecodingParams, GuideType
from refengine.guided.schema_check import check_json_schema
from refengine.guided.state import GrammarState, allowed_tokens

if TYPE_CHECKING:
    from xgrammar import CompiledGrammar, TokenizerInfo

DEFAULT_CACHE_SIZE = 128


@dataclass(frozen=True)
class GuidedDecodingStats:
    """Cumulative figures of one engine's guided decoding."""

    num_compiles: int  # guides compiled (cache misses that compiled)
    num_cache_hits: int
    compile_seconds: float  # total time spent compiling
    num_masks: int  # next-token masks computed
    mask_seconds: float  # total time spent computing them
    num_cached: int

    @property
    def cache_hit_rate(self) -> float:
        lookups = self.num_compiles + self.num_cache_hits
        return self.num_cache_hits / lookups if lookups else 0.0


class GuidedDecoder:
    def __init__(self, tokenizer_info: TokenizerInfo, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        import xgrammar

        self._xgrammar = xgrammar
        self._tokenizer_info = tokenizer_info
        # xgrammar's own cache is unbounded by entries; this one is the bound, so its cache is off.
        self._compiler = xgrammar.GrammarCompiler(tokenizer_info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._num_compiles = 0
        self._num_hits = 0
        self._compile_seconds = 0.0
        self._timing = _MaskTiming()

    @property
    def vocab_size(self) -> int:
        return self._tokenizer_info.vocab_size

    def stats(self) -> GuidedDecodingStats:
        with self._lock:
            return GuidedDecodingStats(self._num_compiles, self._num_hits, self._compile_seconds, self._timing.count, self._timing.seconds, len(self._cache))

    def new_state(self, params: GuidedDecodingParams) -> GrammarState:
        """A fresh per-sequence state for `params`; raises `InvalidRequestError` if it cannot compile."""
        return GrammarState(self._xgrammar.GrammarMatcher(self.compile(params)), self.vocab_size, self._timing)

    def compile(self, params: GuidedDecodingParams) -> CompiledGrammar:
        key = params.cache_key
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                self._num_hits += 1
                return compiled
        started = time.perf_counter()
        compiled = self._compile(params)
        self._check_accepts_something(params, compiled)
        elapsed = time.perf_counter() - started
        with self._lock:
            self._num_compiles += 1
            self._compile_seconds += elapsed
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, params: GuidedDecodingParams) -> CompiledGrammar:
        guide_type, guide = params.guide_type, params.guide
        if guide_type in (GuideType.JSON_SCHEMA, GuideType.STRUCTURAL_TAG):
            try:
                document = json.loads(guide)
            except ValueError as error:
                raise InvalidRequestError(GUIDE_FIELD, f"the {guide_type.value} guide is not valid JSON ({error})") from None
            if guide_type is GuideType.JSON_SCHEMA:
                check_json_schema(document)
        compiler = self._compiler
        try:
            if guide_type is GuideType.JSON:
                return compiler.compile_json_schema("{}", any_whitespace=False)  # any JSON value; the guide is unused
            if guide_type is GuideType.JSON_SCHEMA:
                return compiler.compile_json_schema(guide, any_whitespace=False)
            if guide_type is GuideType.REGEX:
                return compiler.compile_regex(guide)
            if guide_type is GuideType.EBNF_GRAMMAR:
                return compiler.compile_grammar(guide)
            return compiler.compile_structural_tag(guide)
        except (RuntimeError, ValueError, TypeError) as error:  # xgrammar reports every refusal as one of these
            raise InvalidRequestError(GUIDE_FIELD, f"xgrammar cannot compile the {guide_type.value} guide: {_reason(error)}") from None

    def _check_accepts_something(self, params: GuidedDecodingParams, compiled: CompiledGrammar) -> None:
        matcher = self._xgrammar.GrammarMatcher(compiled)
        bitmask = self._xgrammar.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        allowed = allowed_tokens(bitmask, self.vocab_size)
        allowed[list(matcher.stop_token_ids)] = False
        if not bool(allowed.any()):
            what = "only the empty output" if matcher.is_completed() else "no output"
            raise InvalidRequestError(GUIDE_FIELD, f"the {params.guide_type.value} guide accepts {what} with this tokenizer's vocabulary")


class _MaskTiming:
    """Mask computations counted across every sequence of one engine (one thread computes them)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    text = str(error).strip()
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
    return text.splitlines()[0] if text else type(error).__name__

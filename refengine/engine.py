"""`LLMEngine`: requests in, tokens out. A step is three verbs: schedule → execute → update.

Thread-safe: `add_request`, `abort` and `step` take one lock. For serving, `EngineLoop`
(engine_loop.py) runs `step` on a background thread and streams outputs per request.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from refengine.checkpoint import load_checkpoint, load_engine_dir
from refengine.config import EngineConfig
from refengine.errors import EngineConfigError, InvalidRequestError
from refengine.guided.params import GUIDE_TYPE_FIELD
from refengine.kv_cache import KVCacheUsage
from refengine.lora.cache import LoraCache
from refengine.lora.request import LoraRequest
from refengine.model_runner import DecoderModel, ModelRunner, load_model, torch_dtype
from refengine.outputs import RequestOutput
from refengine.priority import DEFAULT_PRIORITY, check_priority
from refengine.request_state import CompletionState, RequestState
from refengine.request_validation import validate_request
from refengine.sampling import SamplingParams
from refengine.scheduler import Scheduler
from refengine.speculative.loading import load_drafter, speculative_settings
from refengine.speculative.medusa_planner import MedusaDrafter, MedusaSpeculator, check_medusa_request
from refengine.speculative.medusa_tree import as_choices
from refengine.speculative.planner import Drafter, Speculator, check_draft_logits
from refengine.stats import EngineStats
from refengine.step_messages import ScheduledSequence

if TYPE_CHECKING:
    import torch
    from xgrammar import TokenizerInfo

    from refengine.guided.compiler import GuidedDecoder
    from refengine.guided.state import GrammarState


class LLMEngine:
    def __init__(self, model: DecoderModel, config: EngineConfig | None = None, drafter: Drafter | MedusaDrafter | None = None) -> None:
        """`drafter` (speculative decoding, refengine/speculative) needs `config.max_draft_len` > 0, and the reverse."""
        self._config = config or EngineConfig()
        if (drafter is None) != (self._config.max_draft_len == 0):
            raise EngineConfigError("max_draft_len", f"{self._config.max_draft_len} needs a drafter, and a drafter max_draft_len > 0")
        self._speculator: Speculator | MedusaSpeculator | None = None
        if isinstance(drafter, MedusaDrafter):
            self._speculator = MedusaSpeculator(drafter, self._config.max_num_tokens)
        elif drafter is not None:
            self._speculator = Speculator(drafter, self._config.max_draft_len, self._config.max_num_tokens)
        self._model = model
        self._scheduler = Scheduler(self._config, model.kv_cache_layout.long_prompt_threshold)
        self._runner = ModelRunner(model, self._config.total_kv_blocks, self._config.tokens_per_block)
        self._lora = LoraCache(model.lora_shape, self._config.lora, torch_dtype(self._config.compute_dtype))
        self._requests: dict[str, RequestState] = {}
        self._held_outputs: list[RequestOutput] = []
        self._request_numbers = itertools.count()
        self._seeds = random.Random()
        self._lock = threading.RLock()
        self._num_steps = 0
        self._num_generated_tokens = 0
        self._num_draft_tokens = [0, 0]  # speculative decoding: drafted, accepted
        self._guided: GuidedDecoder | None = None  # once enabled

    def enable_guided_decoding(self, tokenizer_info: str | Path | TokenizerInfo, *, cache_size: int | None = None) -> None:
        """Serve guided requests, with the vocabulary of TensorRT-LLM's xgrammar tokenizer-info file
        (a path), or of an `xgrammar.TokenizerInfo` of the model's vocabulary size."""
        from refengine.guided.compiler import DEFAULT_CACHE_SIZE, GuidedDecoder
        from refengine.guided.tokenizer_info import TokenizerInfoError, load_tokenizer_info

        info = load_tokenizer_info(tokenizer_info, self.vocab_size) if isinstance(tokenizer_info, (str, Path)) else tokenizer_info
        if info.vocab_size != self.vocab_size:
            raise TokenizerInfoError(f"the tokenizer info has {info.vocab_size} ids, the model's logits {self.vocab_size}")
        self._guided = GuidedDecoder(info, cache_size=cache_size or DEFAULT_CACHE_SIZE)

    @property
    def guided_decoder(self) -> GuidedDecoder | None:
        """The `GuidedDecoder` (compile cache and its figures), or None when guided decoding is off."""
        return self._guided

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, config: EngineConfig | None = None) -> LLMEngine:
        """An engine over a TensorRT-LLM checkpoint directory, with `config` (or default) limits."""
        config = config or EngineConfig()
        model = load_model(load_checkpoint(checkpoint_dir), torch_dtype(config.compute_dtype), config.fp16_weight_gemm)
        return cls(model, config)

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, medusa_choices: str | Sequence[Sequence[int]] | None = None, **overrides: Any) -> LLMEngine:
        """An engine over a CPU engine directory; limits from its build_config, `overrides` on top. `medusa_choices`
        (a Medusa engine; Triton's tensorrt_llm parameter): a tree replacing the engine's, refused by name when it is
        deeper than the heads or has more nodes than max_draft_len; empty or None: the engine's own."""
        engine = load_engine_dir(engine_dir)
        speculative = speculative_settings(engine)
        if speculative is not None:
            overrides = {"max_draft_len": speculative.max_draft_len, **overrides}
        config = EngineConfig.from_build_config(engine.build_config, **overrides)
        model = load_model(engine.checkpoint, torch_dtype(config.compute_dtype), config.fp16_weight_gemm)
        drafter = load_drafter(engine, speculative, config) if speculative is not None and config.max_draft_len else None
        if medusa_choices:
            if not isinstance(drafter, MedusaDrafter):
                raise EngineConfigError("medusa_choices", f"{engine.directory} is not a Medusa engine (refengine_speculative.kind medusa)")
            try:
                drafter = drafter.with_choices(as_choices(medusa_choices))
            except ValueError as error:
                raise EngineConfigError("medusa_choices", str(error).removeprefix("medusa_choices: ")) from None
        return cls(model, config, drafter)

    # -- figures ---------------------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        return self._config

    def limit_beam_width(self, max_beam_width: int) -> None:
        """Serve at most `max_beam_width` beams (Triton's max_beam_width, <= the engine's)."""
        with self._lock:
            self._config = self._config.replace(max_beam_width=min(max_beam_width, self._config.max_beam_width))

    @property
    def num_medusa_heads(self) -> int:
        """The Medusa heads the engine drafts with (0: not a Medusa engine); a tree is never deeper."""
        return self._speculator.drafter.heads.num_heads if isinstance(self._speculator, MedusaSpeculator) else 0

    @property
    def vocab_size(self) -> int:
        return self._model.vocab_size

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler (for inspection: queue lengths, KV cache, preemption count)."""
        return self._scheduler

    @property
    def lora_cache(self) -> LoraCache:
        """The LoRA adapter cache (for inspection: cached task ids, pins, bytes)."""
        return self._lora

    def load_lora_adapter(self, task_id: int, weights: Any, config: Any) -> None:
        """Cache an adapter before any request asks for it (TensorRT-LLM's lora_prefetch_dir); `InvalidRequestError`
        naming the input when it does not fit the model or the cache."""
        with self._lock:
            self._lora.load(LoraRequest(task_id, weights, config))

    def kv_cache_usage(self) -> KVCacheUsage:
        with self._lock:
            return self._scheduler.kv_cache.usage()

    def stats(self) -> EngineStats:
        """Cumulative counters since the engine started (tokens, prefix reuse, preemptions)."""
        with self._lock:
            scheduler = self._scheduler
            return EngineStats(
                num_steps=self._num_steps,
                num_generated_tokens=self._num_generated_tokens,
                num_prompt_tokens_computed=scheduler.num_prompt_tokens_computed,
                num_prompt_tokens_reused=scheduler.num_prefix_cache_hit_tokens,
                num_prefix_cache_hits=scheduler.num_prefix_cache_hits,
                num_preemptions=scheduler.num_preemptions,
                num_draft_tokens=self._num_draft_tokens[0],
                num_accepted_draft_tokens=self._num_draft_tokens[1],
                **self._tree_stats(),
            )

    def _tree_stats(self) -> dict[str, Any]:
        if not isinstance(self._speculator, MedusaSpeculator):
            return {}
        acceptances = self._speculator.node_acceptances
        return {
            "num_tree_steps": self._speculator.num_tree_steps,
            "tree_node_acceptances": tuple(sorted(acceptances.items(), key=lambda item: (len(item[0]), item[0]))),
        }

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._requests) or bool(self._held_outputs)

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        lora: LoraRequest | None = None,
        priority: float = DEFAULT_PRIORITY,
    ) -> str:
        """Queue a request; returns its id. Raises `InvalidRequestError` for a bad input. `lora`: its adapter, by
        TensorRT-LLM's task id (with the adapter's weights and config the first time, refengine/lora/cache.py).
        `priority`: in [0, 1], higher is scheduled first and may preempt lower (refengine/priority.py)."""
        params = params if params is not None else SamplingParams()
        priority = check_priority(priority)
        # A model may limit a request's length (`max_request_tokens`, e.g. Gemma 2's window); most have no such attribute.
        model_limit = getattr(self._model, "max_request_tokens", None)
        prompt = validate_request(prompt_token_ids, params, self._config, self.vocab_size, model_limit)
        if self._speculator is None:
            check_draft_logits(params, None)
            check_medusa_request(params, None)
        else:
            params = self._speculator.check_request(params)
        grammar = self._grammar_of(params)  # compiled outside the lock: the engine keeps stepping
        with self._lock:
            if request_id is None:
                request_id = f"req-{next(self._request_numbers)}"
            elif not isinstance(request_id, str) or not request_id:
                raise InvalidRequestError("request_id", f"must be a non-empty string, got {request_id!r}")
            if request_id in self._requests:
                raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
            if lora is not None and not isinstance(lora, LoraRequest):
                raise InvalidRequestError("lora", f"must be a LoraRequest, got {type(lora).__name__}")
            adapter = self._lora.acquire(lora) if lora is not None else None  # the last check: it pins the adapter
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            self._scheduler.add_request(request_id, prompt, params, seed, grammar, adapter, priority)
            self._requests[request_id] = RequestState(
                request_id,
                prompt,
                params,
                [CompletionState(i) for i in range(params.n)],
                lora_task_id=adapter.task_id if adapter is not None else None,
            )
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks; its final output comes with the next step.
        An unknown (or finished) id is a no-op."""
        with self._lock:
            state = self._drop(request_id)
            if state is None:
                return
            self._scheduler.abort_request(request_id)
            for completion in state.completions:
                if completion.finish_reason is None:
                    completion.finish_reason = "aborted"
            self._held_outputs.append(state.snapshot(self._scheduler.kv_cache.pop_blocks_given(request_id)))

    # -- running ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine iteration; returns the outputs of every request that advanced."""
        with self._lock:
            held, self._held_outputs = self._held_outputs, []
            return held + self._run_step()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora: LoraRequest | Sequence[LoraRequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run the prompts to completion; final outputs in prompt order. `lora`: one adapter for all, or one (or None)
        per prompt: the prompts run in one batch whatever their adapters.

        Holds the engine lock throughout (other threads' submissions wait); outputs of requests
        added elsewhere are kept for the next `step()`.
        """
        all_params = _per_prompt(prompts, params, SamplingParams, "sampling_params", SamplingParams())
        all_lora = _per_prompt(prompts, lora, LoraRequest, "lora", None)
        with self._lock:
            request_ids: list[str] = []
            try:
                for prompt, prompt_params, prompt_lora in zip(prompts, all_params, all_lora):
                    request_ids.append(self.add_request(prompt, prompt_params, lora=prompt_lora))
            except InvalidRequestError:
                for request_id in request_ids:
                    self._drop(request_id)
                    self._scheduler.abort_request(request_id)
                raise
            final: dict[str, RequestOutput] = {}
            while len(final) < len(request_ids):
                for output in self._run_step():
                    if output.request_id in request_ids and output.finished:
                        final[output.request_id] = output
                    elif output.request_id not in request_ids:
                        self._held_outputs.append(output)
            return [final[request_id] for request_id in request_ids]

    def stream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, lora: LoraRequest | None = None, priority: float = DEFAULT_PRIORITY
    ) -> Iterator[RequestOutput]:
        """Yield this request's outputs step by step, driving the engine from the caller's thread.

        Outputs of other requests produced meanwhile are kept for the next `step()`. Closing the
        iterator early aborts the request.
        """
        request_id = self.add_request(prompt_token_ids, params, lora=lora, priority=priority)
        finished = False
        try:
            while not finished:
                with self._lock:
                    produced = self._run_step()
                    mine = [o for o in produced if o.request_id == request_id]
                    self._held_outputs.extend(o for o in produced if o.request_id != request_id)
                for output in mine:
                    finished = output.finished
                    yield output
        finally:
            if not finished:
                self.abort(request_id)
                with self._lock:
                    self._held_outputs = [o for o in self._held_outputs if o.request_id != request_id]

    # -- internals -------------------------------------------------------------------------
    def _grammar_of(self, params: SamplingParams) -> GrammarState | None:
        if params.guided_decoding is None:
            return None
        if self._guided is None:
            raise InvalidRequestError(GUIDE_TYPE_FIELD, "guided decoding is off on this server (serve.guided_decoding: none)")
        return self._guided.new_state(params.guided_decoding)

    def _run_step(self) -> list[RequestOutput]:
        if not self._scheduler.has_unfinished():
            return []
        scheduler_output = self._scheduler.schedule()
        if not scheduler_output.scheduled and not scheduler_output.preempted_seq_ids:
            raise RuntimeError(f"scheduler made no progress with {self._scheduler.num_waiting} waiting and {self._scheduler.num_running} running sequences")
        if self._speculator is not None:
            scheduler_output = self._speculator.add_drafts(scheduler_output, self._scheduler)
        self._mark_scheduled(scheduler_output.scheduled)
        runner_output = self._runner.execute(scheduler_output)
        self._take_context_logits(runner_output.context_logits)
        updates = self._scheduler.update_from_output(scheduler_output, runner_output)
        if self._speculator is not None:
            self._speculator.after_step(scheduler_output, runner_output, self._scheduler)
        self._num_steps += 1
        now_ns = time.time_ns()
        advanced: dict[str, RequestState] = {}
        for update in updates:
            if not update.replaces_output or update.finish_reason is not None:  # a beam's tokens count once, at its end
                self._num_generated_tokens += len(update.new_token_ids)
            self._num_draft_tokens[0] += update.num_draft_tokens
            self._num_draft_tokens[1] += update.num_accepted_draft_tokens
            state = self._requests.get(update.request_id)
            if state is not None:
                state.apply(update, now_ns)
                advanced[update.request_id] = state
        outputs = []
        for request_id, state in advanced.items():
            if not state.output_due(self._config.stream_interval):
                continue
            if state.finished:
                outputs.append(state.snapshot(self._scheduler.kv_cache.pop_blocks_given(request_id)))
                self._drop(request_id)
            else:
                outputs.append(state.snapshot(self._scheduler.kv_cache.blocks_given(request_id)))
        return outputs

    def _drop(self, request_id: str) -> RequestState | None:
        """Forget a request (finished, aborted or refused), unpinning its adapter."""
        state = self._requests.pop(request_id, None)
        if state is not None and state.lora_task_id is not None:
            self._lora.release(state.lora_task_id)
        return state

    def _take_context_logits(self, context_logits: Mapping[int, tuple[int, torch.Tensor]]) -> None:
        for seq_id, (first_position, rows) in context_logits.items():
            sequence = self._scheduler.get_sequence(seq_id)
            state = self._requests.get(sequence.request_id) if sequence is not None else None
            if state is not None:
                state.add_context_logits(first_position, rows)

    def _mark_scheduled(self, scheduled: Iterable[ScheduledSequence]) -> None:
        now_ns = time.time_ns()
        for item in scheduled:
            sequence = self._scheduler.get_sequence(item.seq_id)
            state = self._requests.get(sequence.request_id) if sequence is not None else None
            if state is not None and state.first_scheduled_time_ns is None:
                state.first_scheduled_time_ns = now_ns


def _per_prompt(prompts: Sequence[Sequence[int]], value: Any, kind: type, field: str, default: Any) -> list[Any]:
    """`value` for every prompt (one value, or None for `default`), or one per prompt."""
    if value is None or isinstance(value, kind):
        return [default if value is None else value] * len(prompts)
    values = list(value)
    if len(values) != len(prompts):
        raise InvalidRequestError(field, f"{len(values)} values for {len(prompts)} prompts")
    return values

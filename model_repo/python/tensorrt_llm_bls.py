"""Triton Python model `tensorrt_llm_bls`: the ensemble's pipeline as business-logic scripting.

preprocessing → tensorrt_llm (decoupled, streamed when `stream` is true) → postprocessing, with
the ensemble's client inputs and outputs. The BLS accumulates each sequence's tokens and hands
postprocessing the tokens that precede every new batch, so streamed deltas keep their spaces and
whole UTF-8 characters on either LLM variant (the `tensorrtllm` C++ backend included).

Each request runs on its own thread (reused from ended requests: WorkerThreads), so one instance
serves many requests at once (Triton 2.51's Python backend accepts BLS calls from threads the model
starts). A watcher thread polls each
request's cancellation every `cancellation_check_period_ms` (100 by default), streamed or not, and
forwards a client cancellation to tensorrt_llm as TensorRT-LLM's `stop` request with this BLS's
unique request id, which ends the generation and frees its KV cache. The response sender is owned
by a `ResponseChannel`, which is never polled after the final response (response_channel.py).
The tensor names it wires come from its contract.json (client_contract.py), written by the package stage.
With a `tokenizer_dir` parameter (rendered by default) the deltas are decoded here with postprocessing's own
function instead of one postprocessing call per response (a server round trip per streamed token, issue #18);
without it, postprocessing decodes them as in NVIDIA's BLS.

Draft-target speculative decoding (a request with num_draft_tokens > 0, in a repository whose tensorrt_llm engine is
draft_tokens_external and that serves the draft as `tensorrt_llm_draft_model_name`) runs the draft loop of
speculative_loop.py, as NVIDIA's BLS does: one prompt, not streamed, no context logits, one beam; draft tokens are
accepted by comparing them with the target's, or with use_draft_logits true by the draft's distribution: the draft call
returns its generation_logits and the target gets them as draft_logits. num_draft_tokens above the engine's
max_draft_len, or on an engine built without speculation, is refused by name, and so is use_draft_logits true without
drafts. A speculative engine with no draft model beside it (the cpu engine: its draft model or n-gram drafter is inside
refengine) gets the request's num_draft_tokens and use_draft_logits passed on as its own inputs (0 turns speculation off
for the request), streamed or not.
"""

from __future__ import annotations

import json
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils
from bls_tensors import UpstreamError, call_model, client_flag, stop_words
from client_contract import BlsWiring, figures_not_given
from deferred_release import DeferredRelease
from hf_tokenizer import HFTokenizer
from incremental_detokenizer import CONTEXT_TOKENS, text_delta
from model_contract import load_model_contract
from model_parameters import ModelParameters
from response_channel import CancellationWatcher, ResponseChannel, WorkerThreads
from speculative_loop import DraftLogits, draft_target_generate, use_draft_logits_refusal
from triton_io import BadRequest, error_response, input_arrays, log_error, optional_input, requested_outputs, send_stop, string_tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_LLM_OUTPUTS = ["output_ids", "sequence_length"]  # per streamed token: few tensors (sequence_index only with n > 1)
_LOG_PROB_OUTPUTS = ["cum_log_probs", "output_log_probs"]
# set anew for every call of the draft loop
_PER_STEP_INPUTS = ("input_ids", "input_lengths", "request_output_len", "streaming", "exclude_input_in_output")


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = ModelParameters(model_config, args["model_repository"])
        self._wiring = BlsWiring.from_contract(load_model_contract(args["model_repository"], args["model_version"]))
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self._preprocessing = parameters.string("preprocessing_model_name", "preprocessing")
        self._llm = parameters.string("tensorrt_llm_model_name", "tensorrt_llm")
        self._postprocessing = parameters.string("postprocessing_model_name", "postprocessing")
        # With tokenizer_dir the BLS decodes its deltas itself (postprocessing's function, so the same text): one
        # round trip through the server per streamed token less. Without it, every delta is a postprocessing call.
        self._tokenizer = HFTokenizer(parameters.path("tokenizer_dir")) if parameters.string("tokenizer_dir", "") else None
        self._skip_special_tokens = parameters.boolean("skip_special_tokens", True)
        self._draft = parameters.string("tensorrt_llm_draft_model_name", "") or None
        self._max_draft_len = parameters.integer("max_draft_len", 0)
        # a speculative engine without a draft model beside it drafts by itself (the cpu engine): it reads num_draft_tokens
        self._drafts_inside = self._max_draft_len > 0 and self._draft is None
        self._exclude_input_default = parameters.boolean("exclude_input_in_output", True)
        self._finished_calls = DeferredRelease()  # see deferred_release.py
        self._watcher = CancellationWatcher(
            parameters.integer("cancellation_check_period_ms", 100) / 1000.0,
            on_error=lambda message: log_error(f"tensorrt_llm_bls: {message}"),
            every_period=self._finished_calls.release_due,
            name="tensorrt_llm_bls-watch",
        ).start()
        self._workers = WorkerThreads("tensorrt_llm_bls-request")

    def execute(self, requests):
        for request in requests:
            channel = ResponseChannel(request.get_response_sender(), FINAL)
            self._workers.run(self._serve, request, channel)
        return None

    def finalize(self):
        self._watcher.stop()

    def _serve(self, request, channel):
        try:
            self._generate(request, channel)
        except BadRequest as error:
            channel.send(error_response(str(error)), final=True)
        except UpstreamError as error:
            channel.send(pb_utils.InferenceResponse(output_tensors=[], error=error.triton_error), final=True)
        except Exception as error:  # never let one request take the model down
            log_error(f"tensorrt_llm_bls: request failed: {type(error).__name__}: {error}")
            channel.send(error_response(f"request failed: {error}", pb_utils.TritonError.INTERNAL), final=True)
        finally:
            self._watcher.forget(channel)

    def _generate(self, request, channel):
        wiring = self._wiring
        client, streaming = self._client_inputs(request)
        exclude_input = bool(client["exclude_input_in_output"].reshape(-1)[0])
        return_log_probs = bool(client["return_log_probs"].reshape(-1)[0]) if "return_log_probs" in client else False
        preprocessed = call_model(
            self._preprocessing,
            {wiring.client_to_preprocessing[name]: array for name, array in client.items() if name in wiring.client_to_preprocessing},
            list(wiring.preprocessing_to_llm),
        )
        if preprocessed["INPUT_ID"].shape[0] != 1:
            raise BadRequest(
                f"text_input: tensorrt_llm_bls takes one prompt per request, got a batch of {preprocessed['INPUT_ID'].shape[0]}; "
                "send them as separate requests, or batched to the ensemble"
            )
        llm_inputs = {wiring.preprocessing_to_llm[name]: array for name, array in preprocessed.items()}
        llm_inputs.update({wiring.client_to_llm[name]: array for name, array in client.items() if name in wiring.client_to_llm})
        prompt = preprocessed["INPUT_ID"][0, : int(preprocessed["REQUEST_INPUT_LEN"].reshape(-1)[0])].tolist()
        # Streamed output never holds the prompt; a non-streamed one does unless excluded.
        context = prompt[-CONTEXT_TOKENS:] if (streaming or exclude_input) else []
        requested = requested_outputs(request)
        num_draft_tokens = self._num_draft_tokens(request, client, streaming)
        given = optional_input(request, "use_draft_logits")
        use_logits = bool(given.reshape(-1)[0]) if given is not None and given.size else None
        # a cpu engine drafts by default when num_draft_tokens is unset (and checks its drafter itself)
        drafts = bool(num_draft_tokens) or (self._drafts_inside and optional_input(request, "num_draft_tokens") is None)
        if refusal := use_draft_logits_refusal(use_logits, max_draft_len=self._max_draft_len, drafts=drafts):
            raise BadRequest(refusal)
        if self._drafts_inside:  # the cpu engine drafts inside: the request's draft length (0: off) and acceptance go to it
            if optional_input(request, "num_draft_tokens") is not None:
                llm_inputs["num_draft_tokens"] = np.array([[num_draft_tokens]], dtype=np.int32)
            if use_logits is not None:
                llm_inputs["use_draft_logits"] = np.array([[use_logits]], dtype=np.bool_)
        elif num_draft_tokens:
            self._speculate(llm_inputs, prompt, num_draft_tokens, exclude_input, channel, requested, bool(use_logits))
            return
        samples = int(client["num_return_sequences"].reshape(-1)[0]) if "num_return_sequences" in client else 1
        outputs = _LLM_OUTPUTS + (["sequence_index"] if samples > 1 else []) + (_LOG_PROB_OUTPUTS if return_log_probs else [])
        # What else the client asked for that tensorrt_llm gives (perf metrics, token counts, batch_index)
        outputs += [llm for llm, name in wiring.llm_to_client.items() if name in requested and llm not in outputs and llm not in _LOG_PROB_OUTPUTS]
        self._relay(llm_inputs, outputs, context, streaming, channel, requested)

    def _num_draft_tokens(self, request, client, streaming):
        """num_draft_tokens of a draft-target request (0: decode without a draft), checked as NVIDIA's BLS checks it."""
        given = optional_input(request, "num_draft_tokens")
        wanted = int(given.reshape(-1)[0]) if given is not None and given.size else 0
        if wanted < 0:
            raise BadRequest(f"num_draft_tokens: must be 0 (no drafts) or more, got {wanted}")
        if wanted == 0:
            return 0
        if self._max_draft_len <= 0:
            raise BadRequest(
                "num_draft_tokens: the engine was built without draft-target speculative decoding "
                "(build.speculative.mode draft_tokens_external, max_draft_len 0); send no num_draft_tokens"
            )
        if wanted > self._max_draft_len:
            raise BadRequest(f"num_draft_tokens: {wanted} exceeds the engine's max_draft_len ({self._max_draft_len})")
        if self._drafts_inside:
            return wanted  # the engine drafts inside (the cpu engine carries its draft model or drafts n-grams)
        refusals = (
            (streaming, "stream: streaming is not supported with speculative decoding (num_draft_tokens)"),
            (client_flag(client, "return_context_logits"), "return_context_logits: context logits are not supported with speculative decoding"),
            (client_flag(client, "return_generation_logits"), "return_generation_logits: generation logits are not returned with speculative decoding"),
            ("beam_width" in client and int(client["beam_width"].reshape(-1)[0]) > 1, "beam_width: speculative decoding runs one beam"),
        )
        for refused, message in refusals:
            if refused:
                raise BadRequest(message)
        return wanted

    def _speculate(self, llm_inputs, prompt, num_draft_tokens, exclude_input, channel, requested, use_logits=False):
        """The draft loop over two non-streamed calls per step; one response at the end."""
        shared = {name: array for name, array in llm_inputs.items() if name not in _PER_STEP_INPUTS}
        shared["streaming"] = np.array([[False]], dtype=np.bool_)
        shared["exclude_input_in_output"] = np.array([[True]], dtype=np.bool_)
        cancelled = threading.Event()
        self._watcher.watch(channel, cancelled.set)

        relay = DraftLogits()

        def step(model, sequence, output_len, draft_ids=None, with_logits=False):
            if cancelled.is_set():
                return ([], None) if with_logits else []
            inputs = dict(
                shared,
                input_ids=np.array([sequence], dtype=np.int32),
                input_lengths=np.array([[len(sequence)]], dtype=np.int32),
                request_output_len=np.array([[output_len]], dtype=np.int32),
            )
            if draft_ids:
                inputs["draft_input_ids"] = np.array([draft_ids], dtype=np.int32)
                if use_logits:  # [1, k, vocab], as NVIDIA's BLS sends them
                    inputs["draft_logits"] = relay.for_target(draft_ids)[None]
            if with_logits:
                inputs["return_generation_logits"] = np.array([[True]], dtype=np.bool_)
            return self._generated_ids(model, inputs, with_logits)

        def draft(sequence, n):
            if not use_logits:
                return step(self._draft, sequence, n)
            ids, rows = step(self._draft, sequence, n, with_logits=True)
            relay.keep(ids, rows)
            return ids

        max_tokens = int(llm_inputs["request_output_len"].reshape(-1)[0])
        end_id = int(llm_inputs["end_id"].reshape(-1)[0]) if "end_id" in llm_inputs else None
        result = draft_target_generate(
            prompt,
            max_tokens,
            num_draft_tokens,
            draft=draft,
            target=lambda sequence, draft_ids: step(self._llm, sequence, len(draft_ids) + 1, draft_ids),
            end_id=end_id,
            stop_words=stop_words(llm_inputs.get("stop_words_list")),
        )
        self._watcher.forget(channel)
        if cancelled.is_set():
            channel.send(error_response("request cancelled", pb_utils.TritonError.CANCELLED), final=True)
            return
        preceding, new_ids = (prompt[-CONTEXT_TOKENS:], result.tokens) if exclude_input else ([], [*prompt, *result.tokens])
        figures = {}
        if "return_perf_metrics" in llm_inputs and bool(llm_inputs["return_perf_metrics"].reshape(-1)[0]):
            figures = {
                "acceptance_rate": np.array([[result.acceptance_rate]], dtype=np.float32),
                "total_accepted_draft_tokens": np.array([[result.accepted]], dtype=np.int32),
                "total_draft_tokens": np.array([[result.drafted]], dtype=np.int32),
            }
        channel.send(self._client_response(self._detokenize(preceding, new_ids), figures, requested), final=True)

    def _generated_ids(self, model_name, inputs, with_logits=False):
        """The tokens one non-streamed call of an LLM model generates (the prompt excluded); with_logits: and their
        generation_logits rows ([tokens, vocab], None if the model returned none)."""
        rows = []
        request = pb_utils.InferenceRequest(
            model_name=model_name,
            requested_output_names=["output_ids", "sequence_length"] + (["generation_logits"] if with_logits else []),
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
        )
        tokens = []
        responses = request.exec(decoupled=True)
        try:
            for response in responses:
                if response.has_error():
                    raise UpstreamError(response.error())
                tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
                if "output_ids" in tensors:
                    length = int(tensors["sequence_length"].reshape(-1)[0])
                    tokens.extend(tensors["output_ids"].reshape(-1)[:length].tolist())
                if with_logits and tensors.get("generation_logits") is not None:  # [1, beams, tokens, vocab]: beam 0
                    rows.append(tensors["generation_logits"][0][0])
        finally:
            self._finished_calls.hold(responses)
            del responses
        if with_logits:
            return tokens, (np.concatenate(rows) if rows else None)
        return tokens

    def _client_inputs(self, request):
        client = input_arrays(request, self._wiring.client_inputs)
        for required in ("text_input", "max_tokens"):
            if required not in client:
                raise BadRequest(f"input {required!r} is required")
        streaming = bool(client["stream"].reshape(-1)[0]) if "stream" in client else False
        if streaming and not self._decoupled:
            raise BadRequest("stream: streaming needs the tensorrt_llm_bls model in decoupled mode")
        if "exclude_input_in_output" not in client:  # sent explicitly: the BLS must know what comes back
            client["exclude_input_in_output"] = np.array([[self._exclude_input_default]], dtype=np.bool_)
        return client, streaming

    def _relay(self, llm_inputs, outputs, context, streaming, channel, requested):
        """Run tensorrt_llm, detokenize each response against its sequence's tokens so far, answer."""
        llm_request_id = f"bls-{uuid.uuid4().hex}"
        llm_request = pb_utils.InferenceRequest(
            model_name=self._llm,
            requested_output_names=outputs,
            inputs=[pb_utils.Tensor(name, array) for name, array in llm_inputs.items()],
            request_id=llm_request_id,
        )
        cancelled = threading.Event()

        def cancel():
            cancelled.set()
            self._stop(llm_request_id)

        self._watcher.watch(channel, cancel)
        history: dict[int, list[int]] = {}  # sequence_index → context + tokens so far
        beams = "beam_width" in llm_inputs and int(llm_inputs["beam_width"].reshape(-1)[0]) > 1
        first = True
        pending = []
        llm_responses = llm_request.exec(decoupled=True)
        try:
            for llm_response in llm_responses:
                if llm_response.has_error():
                    raise UpstreamError(llm_response.error())
                tensors = {t.name(): t.as_numpy() for t in llm_response.output_tensors()}
                if "output_ids" not in tensors or cancelled.is_set():
                    continue
                if first and (refused := figures_not_given(llm_inputs, tensors, requested)):
                    self._stop(llm_request_id)
                    self._watcher.forget(channel)
                    raise BadRequest(f"{refused}: the {self._llm} model returned none of these figures, so the BLS cannot either")
                first = False
                if beams:  # every returned beam whole in each response (one per step when streamed): one text per beam
                    response = self._client_response(self._detokenize_beams(context, tensors), tensors, requested)
                else:
                    response = self._text_response(history, context, tensors, requested)
                if streaming:
                    channel.send(response)
                else:
                    pending.append(response)
        finally:
            self._finished_calls.hold(llm_responses)  # the stub must let go of it first
            del llm_responses
        self._watcher.forget(channel)
        if cancelled.is_set():
            channel.send(error_response("request cancelled", pb_utils.TritonError.CANCELLED), final=True)
            return
        for response in pending[:-1]:
            channel.send(response)
        channel.send(pending[-1] if pending else None, final=True)

    def _text_response(self, history, context, tensors, requested):
        """One sequence's response: its new tokens detokenized against what it held before (`history`)."""
        index = int(tensors["sequence_index"].reshape(-1)[0]) if "sequence_index" in tensors else 0
        tokens = history.setdefault(index, list(context))
        length = int(tensors["sequence_length"].reshape(-1)[0])
        new_ids = tensors["output_ids"].reshape(-1)[:length].tolist()
        response = self._client_response(self._detokenize(tokens[-CONTEXT_TOKENS:], new_ids), tensors, requested)
        tokens.extend(new_ids)
        return response

    def _decode(self, token_ids):
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def _detokenize(self, preceding, new_ids):
        if self._tokenizer is not None:
            return text_delta(self._decode, preceding, new_ids)
        result = call_model(
            self._postprocessing,
            {
                "TOKENS_BATCH": np.array(new_ids, dtype=np.int32).reshape(1, 1, -1),
                "SEQUENCE_LENGTH": np.array([[len(new_ids)]], dtype=np.int32),
                "PRECEDING_IDS": np.array(preceding, dtype=np.int32).reshape(1, 1, -1),
            },
            ["OUTPUT"],
        )
        value = result["OUTPUT"].reshape(-1)[0]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    def _detokenize_beams(self, context, tensors):
        ids, lengths = tensors["output_ids"], tensors["sequence_length"].reshape(1, -1)
        if self._tokenizer is not None:
            return [self._detokenize(context, ids[0, beam, : int(lengths[0, beam])].tolist()) for beam in range(ids.shape[1])]
        preceding = np.array([context] * ids.shape[1], dtype=np.int32).reshape(1, ids.shape[1], len(context))
        result = call_model(self._postprocessing, {"TOKENS_BATCH": ids, "SEQUENCE_LENGTH": lengths, "PRECEDING_IDS": preceding}, ["OUTPUT"])
        return [value.decode("utf-8") if isinstance(value, bytes) else str(value) for value in result["OUTPUT"].reshape(-1)]

    def _client_response(self, text, llm_tensors, requested):
        """Only the requested outputs: see triton_io.arrays_response for why (`text`: a list for beams)."""
        texts = text if isinstance(text, list) else [text]
        tensors = [string_tensor("text_output", texts)] if "text_output" in requested else []
        for llm_name, client_name in self._wiring.llm_to_client.items():
            if llm_name in llm_tensors and client_name in requested:
                tensors.append(pb_utils.Tensor(client_name, llm_tensors[llm_name]))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _stop(self, llm_request_id):
        for message in send_stop(self._llm, llm_request_id, keep=self._finished_calls.hold):
            log_error(f"tensorrt_llm_bls: stop of {llm_request_id} failed: {message}")

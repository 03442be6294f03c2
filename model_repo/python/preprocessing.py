"""Triton Python model `preprocessing`: text → token ids for the `tensorrt_llm` contract.

Inputs (batch of B rows): QUERY (text), REQUEST_OUTPUT_LEN, optional BAD_WORDS_DICT /
STOP_WORDS_DICT (one word or phrase per element), END_ID, PAD_ID.
Outputs: INPUT_ID [B, max_len] (padded with the pad id), REQUEST_INPUT_LEN, BAD_WORDS_IDS and
STOP_WORDS_IDS in TensorRT-LLM's [2, L] layout, EMBEDDING_BIAS ([B, vocab] from
EMBEDDING_BIAS_WORDS / _WEIGHTS, or [B, 0]), REQUEST_OUTPUT_LEN, OUT_END_ID, OUT_PAD_ID.

Requests the engine would refuse (prompt longer than max_input_len, max_tokens outside
1..max_seq_len - prompt length) are refused here with a message in the client's terms. Work is
bounded before it is spent: a prompt of more bytes than `max_input_len` tokens can hold
(`max_prompt_bytes`, from the tokenizer's longest token) and a stop/bad word longer than a whole
sequence (`max_word_bytes`) are refused before anything is decoded or tokenized. Refused too are
request parameters nobody reads: HTTP `generate` turns every JSON key that is not an input into
a parameter, so a misspelt input ("temprature") would otherwise be ignored without a word.

The model is dynamically batched: the requests of one execution are read and checked first, then every
prompt of the execution is tokenized by one call of the tokenizer (`encode_batch`); a request that fails
gets its own error response and the others their tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils
from hf_tokenizer import HFTokenizer
from model_parameters import ModelParameters
from triton_io import BadRequest, as_text, batch_size_of, error_response, input_arrays, log_error, required_array, scalar_per_row
from word_lists import to_word_list_batch

TRITON_RESERVED_PREFIX = "triton_"


class TritonPythonModel:
    def initialize(self, args):
        parameters = ModelParameters(json.loads(args["model_config"]), args["model_repository"])
        self.tokenizer = HFTokenizer(parameters.path("tokenizer_dir"))
        self.add_special_tokens = parameters.boolean("add_special_tokens", True)
        self.max_input_len = parameters.integer("max_input_len")
        self.max_seq_len = parameters.integer("max_seq_len")
        self.max_prompt_bytes = parameters.integer("max_prompt_bytes", 0)  # 0: not known, not checked
        self.max_word_bytes = parameters.integer("max_word_bytes", 0)
        if self.tokenizer.eos_id is None:
            raise ValueError(f"tokenizer in {self.tokenizer.directory} defines no eos_token; end_id cannot be derived")
        # What a request without word lists or biases gets, built once (outputs are read-only to Triton).
        self._no_words = to_word_list_batch([[]])
        self._no_bias = np.zeros((1, 0), dtype=np.float32)

    def execute(self, requests):
        """One tokenizer call for every prompt of the execution (several requests with dynamic batching)."""
        read = [self._read(request) for request in requests]  # each request's _Query, or its error response
        texts = [text for query in read if isinstance(query, _Query) for text in query.texts]
        try:
            encoded = iter(self.tokenizer.encode_batch(texts, add_special_tokens=self.add_special_tokens) if texts else [])
        except Exception as error:  # never let one execution take the model down
            log_error(f"preprocessing failed: {type(error).__name__}: {error}")
            return [error_response(f"preprocessing failed: {error}", pb_utils.TritonError.INTERNAL) for _ in requests]
        responses = []
        for query in read:
            if not isinstance(query, _Query):
                responses.append(query)
                continue
            prompts = [next(encoded) for _ in query.texts]
            responses.append(self._guarded(lambda query=query, prompts=prompts: self._respond(query, prompts)))
        return responses

    def _read(self, request):
        return self._guarded(lambda: self._query(request))

    @staticmethod
    def _guarded(step):
        """`step()`, or the error response a request gets when it fails."""
        try:
            return step()
        except BadRequest as error:
            return error_response(str(error))
        except Exception as error:  # never let one request take the model down
            log_error(f"preprocessing failed: {type(error).__name__}: {error}")
            return error_response(f"preprocessing failed: {error}", pb_utils.TritonError.INTERNAL)

    def _query(self, request):
        """Everything of a request but its prompts' token ids, checked (the prompts are tokenized per execution)."""
        _refuse_unknown_parameters(request)
        inputs = input_arrays(request)
        queries = required_array(inputs, "QUERY", "text_input")
        batch = batch_size_of(queries, "text_input")
        rows = scalar_per_row(queries, batch, "text_input")
        for value in rows:
            self._check_bytes(value, "text_input", self.max_prompt_bytes, f"more than the engine's max_input_len {self.max_input_len} tokens can hold")
        texts = [as_text(value, "text_input") for value in rows]
        _refuse_decoder_query(inputs)
        return _Query(
            texts=texts,
            output_lens=scalar_per_row(required_array(inputs, "REQUEST_OUTPUT_LEN", "max_tokens"), batch, "max_tokens"),
            end_ids=scalar_per_row(inputs.get("END_ID"), batch, "end_id") or [self.tokenizer.eos_id] * batch,
            pad_ids=scalar_per_row(inputs.get("PAD_ID"), batch, "pad_id") or [self.tokenizer.pad_id] * batch,
            bad_words=self._word_lists(inputs, "BAD_WORDS_DICT", "bad_words", batch),
            stop_words=self._word_lists(inputs, "STOP_WORDS_DICT", "stop_words", batch),
            embedding_bias=self._embedding_bias(inputs, batch),
        )

    def _respond(self, query, prompts):
        batch = len(prompts)
        for prompt, output_len in zip(prompts, query.output_lens):
            self._check_prompt(prompt)
            self._check_output_len(len(prompt), int(output_len))
        input_ids = np.full((batch, max(len(p) for p in prompts)), query.pad_ids[0], dtype=np.int32)
        for row, prompt in enumerate(prompts):
            input_ids[row, : len(prompt)] = prompt

        def column(values):
            return np.array(values, dtype=np.int32).reshape(batch, 1)

        tensors = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", column([len(p) for p in prompts])),
            # What NVIDIA's preprocessing sends a decoder-only model: one pad id, length 1 (ignored).
            pb_utils.Tensor("DECODER_INPUT_ID", column(query.pad_ids)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", column([1] * batch)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", column(query.output_lens)),
            pb_utils.Tensor("BAD_WORDS_IDS", query.bad_words),
            pb_utils.Tensor("STOP_WORDS_IDS", query.stop_words),
            pb_utils.Tensor("EMBEDDING_BIAS", query.embedding_bias),
            pb_utils.Tensor("OUT_END_ID", column(query.end_ids)),
            pb_utils.Tensor("OUT_PAD_ID", column(query.pad_ids)),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _check_prompt(self, ids):
        if not ids:
            raise BadRequest("text_input is empty: it encodes to no tokens")
        if len(ids) > self.max_input_len:
            raise BadRequest(f"text_input encodes to {len(ids)} tokens, more than the engine's max_input_len {self.max_input_len}")

    @staticmethod
    def _check_bytes(value, name, limit, what):
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogatepass")
        size = len(value) if isinstance(value, bytes) else 0
        if limit and size > limit:
            raise BadRequest(f"{name} is {size} bytes, {what} (at most {limit} bytes); it was not tokenized")

    def _check_word_bytes(self, word, name):
        self._check_bytes(word, name, self.max_word_bytes, f"longer than any sequence of the engine's max_seq_len {self.max_seq_len} tokens")

    def _check_output_len(self, prompt_len, output_len):
        room = self.max_seq_len - prompt_len
        if output_len < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {output_len}")
        if output_len > room:
            raise BadRequest(
                f"max_tokens {output_len} is more than the engine can generate after a {prompt_len}-token prompt: "
                f"max_seq_len {self.max_seq_len} - {prompt_len} = {room}"
            )

    def _embedding_bias(self, inputs, batch):
        """[batch, vocab] logit biases from words and weights (each word's first token gets its
        weight, as NVIDIA's preprocessing does); [batch, 0] without them."""
        words = inputs.get("EMBEDDING_BIAS_WORDS")
        weights = inputs.get("EMBEDDING_BIAS_WEIGHTS")
        if words is None and weights is None:
            return self._no_bias if batch == 1 else np.zeros((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            missing = "embedding_bias_words" if words is None else "embedding_bias_weights"
            raise BadRequest(f"{missing} is missing: embedding_bias_words and embedding_bias_weights go together")
        if words.ndim != 2 or weights.shape != words.shape or words.shape[0] != batch:
            raise BadRequest(f"embedding_bias_words {list(words.shape)} and embedding_bias_weights {list(weights.shape)} must both have shape [batch, n]")
        if not np.isfinite(weights).all():
            raise BadRequest("embedding_bias_weights must be finite numbers")
        bias = np.zeros((batch, self.tokenizer.vocab_size), dtype=np.float32)
        for row in range(batch):
            for word, weight in zip(words[row], weights[row]):
                self._check_word_bytes(word, "embedding_bias_words")
                ids = self.tokenizer.encode(as_text(word, "embedding_bias_words"), add_special_tokens=False)
                if ids:
                    bias[row, ids[0]] += float(weight)
        return bias

    def _word_lists(self, inputs, name, client_name, batch):
        words = inputs.get(name)
        if words is None:
            return self._no_words if batch == 1 else to_word_list_batch([[] for _ in range(batch)])
        if words.ndim != 2 or words.shape[0] != batch:
            raise BadRequest(f"{client_name} must have shape [batch, n], got {list(words.shape)}")
        for row in words:
            for word in row:
                self._check_word_bytes(word, client_name)
        per_row = []
        for row in words:
            encoded = [self.tokenizer.encode(as_text(word, client_name), add_special_tokens=False) for word in row]
            per_row.append([ids for ids in encoded if ids])
        return to_word_list_batch(per_row)


@dataclass(frozen=True)
class _Query:
    """A request read and checked, its prompts not yet tokenized: one value per row (the arrays: [rows, ...])."""

    texts: list[str]
    output_lens: list[int]
    end_ids: list[int]
    pad_ids: list[int]
    bad_words: np.ndarray
    stop_words: np.ndarray
    embedding_bias: np.ndarray


def _refuse_unknown_parameters(request):
    try:
        parameters = json.loads(request.parameters() or "{}")
    except json.JSONDecodeError:
        return
    unknown = sorted(key for key in parameters if not key.startswith(TRITON_RESERVED_PREFIX))
    if unknown:
        raise BadRequest(f"unknown input or parameter {', '.join(repr(k) for k in unknown)}; see the model's inputs with GET /v2/models/<model>/config")


def _refuse_decoder_query(inputs):
    decoder_query = inputs.get("DECODER_QUERY")
    if decoder_query is not None and any(as_text(value, "decoder_text_input") for value in decoder_query.reshape(-1)):
        raise BadRequest("decoder_text_input: the engine is decoder-only; decoder_text_input is for encoder-decoder models")

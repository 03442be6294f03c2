"""Streamed beam search: every output carries the best n running beams whole (TensorRT-LLM streams every beam in
full at each step), the first step's beams are the prompt's top tokens, stream_interval is honoured, and the
final output is the non-streamed one."""

from __future__ import annotations

import math

from refengine import SamplingParams
from tests.refengine.test_refengine_beam_search import _engine, _prompt, hf_beams

BEAMS = SamplingParams(max_tokens=9, beam_width=3, n=2, temperature=0, logprobs=0)


def test_streamed_beams_are_whole_each_step_and_end_as_the_non_streamed_output(tiny_model):
    model = tiny_model("llama_gqa")
    prompt = _prompt(11, 7)
    [alone] = _engine(model.checkpoint_dir).generate([prompt], BEAMS)
    engine = _engine(model.checkpoint_dir)
    outputs = list(engine.stream(prompt, BEAMS))

    assert len(outputs) >= 2 and outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    for step, output in enumerate(outputs[:-1], start=1):
        assert [c.index for c in output.outputs] == [0, 1]
        for completion in output.outputs:
            assert len(completion.token_ids) == step  # the running beam, whole
            assert completion.new_token_ids == completion.token_ids
            assert len(completion.logprobs) == step
            assert math.isclose(completion.cum_log_prob, sum(s.logprob for s in completion.logprobs), rel_tol=1e-5, abs_tol=1e-5)
        assert output.outputs[0].cum_log_prob >= output.outputs[1].cum_log_prob  # best first
    first_step = [c.token_ids for c in outputs[0].outputs]
    assert first_step == [tokens for tokens, _ in hf_beams(model.hf_model, prompt, beams=3, max_new_tokens=1, num_return=2)]
    assert [c.token_ids for c in outputs[-1].outputs] == [c.token_ids for c in alone.outputs]
    assert [c.cum_log_prob for c in outputs[-1].outputs] == [c.cum_log_prob for c in alone.outputs]
    assert engine.stats().num_generated_tokens == sum(len(c.token_ids) for c in alone.outputs)  # counted once, at the end
    kv = engine.scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks


def test_streamed_beams_honour_stream_interval(tiny_model):
    model = tiny_model("llama_gqa")
    prompt = _prompt(12, 5)
    every_step = list(_engine(model.checkpoint_dir).stream(prompt, BEAMS))
    sparse = list(_engine(model.checkpoint_dir, stream_interval=3).stream(prompt, BEAMS))
    lengths = [len(o.outputs[0].token_ids) for o in sparse[:-1]]
    assert lengths == [n for n in range(1, len(every_step)) if n == 1 or n % 3 == 0]
    assert [c.token_ids for c in sparse[-1].outputs] == [c.token_ids for c in every_step[-1].outputs]

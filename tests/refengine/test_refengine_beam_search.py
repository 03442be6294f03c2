"""Beam search equals transformers' `generate(num_beams=B, do_sample=False)` token for token, on the
default model and on every architecture of MODEL_SPECS; beams share the prompt's KV blocks."""

from __future__ import annotations

import random

import pytest
import torch

from refengine import EngineConfig, LLMEngine, SamplingParams
from refengine.errors import InvalidRequestError
from tests.conftest import DEFAULT_MODEL

END_ID = 2


def hf_beams(model, prompt, *, beams, max_new_tokens, num_return, length_penalty=1.0, early_stopping=False, eos=None):
    """transformers' beam search: [(generated tokens without the end token, score)], best first."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            num_beams=beams,
            num_return_sequences=num_return,
            max_new_tokens=max_new_tokens,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            eos_token_id=eos,
            pad_token_id=0 if eos is None else eos,
            return_dict_in_generate=True,
            output_scores=True,
        )
    results = []
    for row, score in zip(out.sequences, out.sequences_scores):
        tokens = row[len(prompt) :].tolist()
        if eos is not None and eos in tokens:
            tokens = tokens[: tokens.index(eos)]
        else:
            tokens = tokens[:max_new_tokens]
        results.append((tuple(tokens), float(score)))
    return results


def _engine(checkpoint_dir, **changes):
    values = dict(tokens_per_block=4, max_num_tokens=64, max_batch_size=8, max_beam_width=4, max_seq_len=128, max_input_len=64)
    values.update(changes)
    return LLMEngine.from_checkpoint(checkpoint_dir, EngineConfig(**values))


def _prompt(seed, length, vocab=256):
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def _check_equal(engine, hf_model, prompt, *, beams, max_tokens, num_return, eos=None, **search):
    params = SamplingParams(max_tokens=max_tokens, beam_width=beams, n=num_return, end_id=eos, temperature=0, **search)
    [output] = engine.generate([prompt], params)
    expected = hf_beams(hf_model, prompt, beams=beams, max_new_tokens=max_tokens, num_return=num_return, eos=eos, **search)
    got = [completion.token_ids for completion in output.outputs]
    assert got == [tokens for tokens, _ in expected]
    return output, expected


def test_beams_match_transformers_on_every_architecture(tiny_model, any_model_name):
    model = tiny_model(any_model_name)
    engine = _engine(model.checkpoint_dir)
    prompt = _prompt(len(any_model_name), 5)
    _check_equal(engine, model.hf_model, prompt, beams=4, max_tokens=6, num_return=4)
    _check_equal(engine, model.hf_model, prompt[:3], beams=2, max_tokens=5, num_return=1, length_penalty=0.5)


@pytest.fixture(scope="module")
def default_model(tmp_path_factory):
    """The default model as transformers loads it, and its TensorRT-LLM checkpoint (float16 export)."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    from tests.refengine.conftest import _add_rope_fields

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    directory = tmp_path_factory.mktemp("ckpt_default")
    export_tensorrt_llm_checkpoint(model, "llama", dtype=torch.float16, export_dir=directory, inference_tensor_parallel=1, inference_pipeline_parallel=1)
    _add_rope_fields(directory / "config.json", model.config)
    return model, directory


@pytest.mark.parametrize(
    "search",
    [
        dict(beams=4, num_return=4, early_stopping=False),
        dict(beams=4, num_return=2, early_stopping=True, length_penalty=0.0),
        dict(beams=2, num_return=2, early_stopping="never", length_penalty=2.0),
    ],
    ids=["default", "early_stop_true", "never"],
)
def test_beams_match_transformers_on_the_default_model_with_end_id(default_model, search):
    from transformers import AutoTokenizer

    model, directory = default_model
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    engine = _engine(directory)
    prompt = tokenizer.encode("def add(a, b):\n    return")
    output, expected = _check_equal(engine, model, prompt, max_tokens=12, eos=END_ID, **search)
    for completion, (_, score) in zip(output.outputs, expected):
        assert completion.cum_log_prob is not None
        length = len(completion.token_ids) + (completion.finish_reason == "stop")
        assert completion.cum_log_prob / length ** search.get("length_penalty", 1.0) == pytest.approx(score, abs=1e-4)


def test_beams_share_the_prompt_blocks_and_free_everything(tiny_model):
    model = tiny_model("llama_gqa")
    engine = _engine(model.checkpoint_dir)
    prompt = _prompt(7, 17)  # 4 full blocks + 1 token
    engine.add_request(prompt, SamplingParams(max_tokens=3, beam_width=4, n=4, temperature=0))
    engine.step()  # the prompt, then the fork into 4 beams
    kv = engine.scheduler.kv_cache
    tables = [kv.block_table(s.seq_id) for s in engine.scheduler.sequences_of("req-0")]
    assert len(tables) == 4 and len({table[:4] for table in tables}) == 1  # the prompt's full blocks, stored once
    while engine.has_unfinished():
        engine.step()
    assert kv.num_free_blocks == kv.num_blocks


def test_beams_run_beside_other_requests_and_equal_running_alone(tiny_model):
    model = tiny_model("llama_gqa")
    alone = _engine(model.checkpoint_dir).generate([_prompt(1, 6)], SamplingParams(max_tokens=5, beam_width=3, n=3, temperature=0))[0]
    engine = _engine(model.checkpoint_dir, num_kv_blocks=40, scheduler_policy="max_utilization")
    prompts = [_prompt(2, 9), _prompt(1, 6), _prompt(3, 11)]
    params = [
        SamplingParams(max_tokens=8, temperature=0),
        SamplingParams(max_tokens=5, beam_width=3, n=3, temperature=0),
        SamplingParams(max_tokens=7, temperature=0.8, seed=5, n=2),
    ]
    outputs = engine.generate(prompts, params)
    assert [c.token_ids for c in outputs[1].outputs] == [c.token_ids for c in alone.outputs]
    kv = engine.scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_blocks


def test_beams_are_refused_under_static_batching(tiny_model):
    engine = _engine(tiny_model("llama_gqa").checkpoint_dir, batching="static")
    with pytest.raises(InvalidRequestError, match="beam_width: 2: beam search runs with inflight batching only"):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, beam_width=2))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(beam_width=8), "beam_width"),
        (dict(beam_width=2, n=3), "n"),
        (dict(beam_width=2, top_k=5, temperature=1.0), "top_k"),
        (dict(beam_width=2, top_p=0.9, temperature=1.0), "top_p"),
        (dict(beam_width=2, temperature=0.7), "temperature"),
        (dict(beam_width=2, logprobs=3), "logprobs"),
        (dict(beam_width=2, return_generation_logits=True), "return_generation_logits"),
        (dict(beam_width=2, early_stopping="sometimes"), "early_stopping"),
        (dict(beam_width=0), "beam_width"),
    ],
)
def test_bad_beam_requests_are_refused_by_field(tiny_model, changes, field):
    engine = _engine(tiny_model("llama_gqa").checkpoint_dir)
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, **changes))
    assert error.value.field == field
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    "search",
    [
        dict(early_stopping=False),
        dict(early_stopping=True),
        dict(early_stopping="never", length_penalty=1.5),
        dict(early_stopping=False, length_penalty=-0.5),
    ],
    ids=["false", "true", "never", "short"],
)
def test_end_id_finishes_beams_as_transformers_does(tiny_model, search):
    """An end id that the beams produce early (the best unconstrained beam's third token), so that
    finished and running beams compete under each early_stopping rule."""
    model = tiny_model("llama_mqa")
    engine = _engine(model.checkpoint_dir)
    prompt = _prompt(11, 4)
    [(best, _)] = hf_beams(model.hf_model, prompt, beams=4, max_new_tokens=10, num_return=1)
    output, _ = _check_equal(engine, model.hf_model, prompt, beams=4, max_tokens=10, num_return=4, eos=best[2], **search)
    stopped = [completion.finish_reason == "stop" for completion in output.outputs]
    assert stopped == [len(completion.token_ids) < 10 for completion in output.outputs]
    assert any(stopped) or search["early_stopping"] == "never"  # "never" with length_penalty 1.5 favours long beams


def hf_beams_with_stop_sequences(model, prompt, stops, *, beams, max_new_tokens, **search):
    """transformers' beam search with a stopping criterion that ends a candidate whose generated tokens end with one of
    `stops` (what StopStringCriteria does for strings): [generated tokens, stop sequence kept], best first."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class EndsWithStop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([_stop_end(row[len(prompt) :].tolist(), stops) is not None for row in input_ids])

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            num_beams=beams,
            num_return_sequences=beams,
            max_new_tokens=max_new_tokens,
            pad_token_id=0,
            stopping_criteria=StoppingCriteriaList([EndsWithStop()]),
            return_dict_in_generate=True,
            **search,
        )
    results = []
    for row in out.sequences:
        tokens = row[len(prompt) :].tolist()
        end = next((i + 1 for i in range(len(tokens)) if _stop_end(tokens[: i + 1], stops) is not None), max_new_tokens)
        results.append(tuple(tokens[:end]))
    return results


def _stop_end(tokens, stops):
    return next((stop for stop in stops if len(stop) <= len(tokens) and tuple(tokens[-len(stop) :]) == stop), None)


@pytest.mark.parametrize(
    "stop_len, search",
    [(1, dict(early_stopping=False)), (2, dict(early_stopping=True)), (2, dict(early_stopping="never", length_penalty=0.5))],
    ids=["one-token", "two-tokens", "never"],
)
def test_stop_sequences_finish_beams_as_transformers_stopping_criteria_do(tiny_model, stop_len, search):
    """Stop sequences the beams produce early (tokens 2.. of the best unconstrained beam), so stopped and running beams
    compete; each stopped beam keeps its stop sequence (TensorRT-LLM's stop words) and says finish_reason stop."""
    model = tiny_model("llama_mqa")
    engine = _engine(model.checkpoint_dir)
    prompt = _prompt(11, 4)
    [(best, _)] = hf_beams(model.hf_model, prompt, beams=4, max_new_tokens=10, num_return=1)
    stops = (tuple(best[2 : 2 + stop_len]),)
    expected = hf_beams_with_stop_sequences(model.hf_model, prompt, stops, beams=4, max_new_tokens=10, **search)
    params = SamplingParams(max_tokens=10, beam_width=4, n=4, temperature=0, stop_token_ids=stops, **search)
    [output] = engine.generate([prompt], params)
    assert [completion.token_ids for completion in output.outputs] == expected
    assert [completion.finish_reason == "stop" for completion in output.outputs] == [_stop_end(t, stops) is not None for t in expected]
    assert any(completion.finish_reason == "stop" for completion in output.outputs)


def test_parallel_samples_run_one_prefill_share_the_prompt_and_reproduce_with_a_seed(tiny_model):
    model = tiny_model("llama_gqa")
    prompt = _prompt(5, 17)  # 4 full blocks + 1 token
    params = SamplingParams(max_tokens=6, temperature=1.0, top_k=20, seed=42, n=4)
    engine = _engine(model.checkpoint_dir)
    engine.add_request(prompt, params)
    engine.step()  # the prompt, its first tokens drawn, the fork
    tables = [engine.scheduler.kv_cache.block_table(s.seq_id) for s in engine.scheduler.sequences_of("req-0")]
    assert len(tables) == 4 and len({table[:4] for table in tables}) == 1
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().num_prompt_tokens_computed == len(prompt)  # one prefill for the four samples
    first = _engine(model.checkpoint_dir).generate([prompt], params)[0]
    again = _engine(model.checkpoint_dir, max_batch_size=4).generate([prompt], params)[0]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({c.token_ids for c in first.outputs}) > 1


def test_beam_width_above_the_engine_is_named_even_with_every_beam_returned(tiny_model):
    engine = _engine(tiny_model("llama_gqa").checkpoint_dir, max_num_samples=2)
    with pytest.raises(InvalidRequestError, match="beam_width: 8 exceeds the engine's max_beam_width 4"):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, beam_width=8, n=8))
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, beam_width=4, n=4))  # n is bounded by beam_width, not max_num_samples

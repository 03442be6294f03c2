"""`EngineLoop`: concurrent submission from many threads, streaming, abort, errors."""

from __future__ import annotations

import random
import threading

import pytest

from refengine import EngineConfig, EngineLoop, InvalidRequestError, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0)
CONFIG = EngineConfig(max_batch_size=8, max_input_len=16, max_seq_len=32, tokens_per_block=4, max_num_tokens=64)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(64) for _ in range(rng.randint(1, 16))] for _ in range(12)]


@pytest.fixture(scope="module")
def expected(small_checkpoint, prompts):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG)
    return [engine.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


def test_concurrent_submitters_get_their_own_results(small_checkpoint, prompts, expected):
    results: dict[int, tuple[int, ...]] = {}

    def worker(index: int) -> None:
        results[index] = loop.submit(prompts[index], GREEDY).result().outputs[0].token_ids

    with EngineLoop(LLMEngine.from_checkpoint(small_checkpoint, CONFIG)) as loop:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert [results[i] for i in range(len(prompts))] == expected


def test_stream_yields_deltas_until_finished(small_checkpoint, prompts, expected):
    with EngineLoop(LLMEngine.from_checkpoint(small_checkpoint, CONFIG)) as loop:
        outputs = list(loop.submit(prompts[0], GREEDY))
    assert outputs[-1].finished
    assert sum((o.outputs[0].new_token_ids for o in outputs), ()) == expected[0]


def test_bad_submission_raises_in_the_caller(small_checkpoint, prompts, expected):
    with EngineLoop(LLMEngine.from_checkpoint(small_checkpoint, CONFIG)) as loop:
        good = loop.submit(prompts[1], GREEDY)
        with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
            loop.submit([], GREEDY)
        assert good.result().outputs[0].token_ids == expected[1]


def test_abort_through_the_loop(small_checkpoint, prompts):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG)
    with EngineLoop(engine) as loop:
        stream = loop.submit(prompts[2], SamplingParams(max_tokens=20, temperature=0))
        loop.abort(stream.request_id)
        final = stream.result()
    assert final.outputs[0].finish_reason in ("aborted", "length")
    assert engine.kv_cache_usage().num_used_blocks == 0


def test_stop_aborts_what_is_still_running(small_checkpoint, prompts):
    engine = LLMEngine.from_checkpoint(small_checkpoint, CONFIG)
    loop = EngineLoop(engine)  # never started: nothing runs
    stream = loop.submit(prompts[3], GREEDY)
    loop.stop()
    assert stream.result().outputs[0].finish_reason == "aborted"
    assert not engine.has_unfinished()


def test_on_output_gets_every_output_on_the_loop_thread(small_checkpoint, prompts, expected):
    received: dict[str, list] = {}
    threads: set[str] = set()
    done = threading.Event()

    def on_output(item) -> None:
        threads.add(threading.current_thread().name)
        received.setdefault(item.request_id, []).append(item)
        if len(received) == 3 and all(outputs[-1].finished for outputs in received.values()):
            done.set()

    with EngineLoop(LLMEngine.from_checkpoint(small_checkpoint, CONFIG)) as loop:
        ids = [loop.submit(prompts[i], GREEDY, on_output=on_output).request_id for i in range(3)]
        assert done.wait(60)
    assert threads == {"refengine-loop"}
    for index, request_id in enumerate(ids):
        outputs = received[request_id]
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
        assert sum((o.outputs[0].new_token_ids for o in outputs), ()) == expected[index]

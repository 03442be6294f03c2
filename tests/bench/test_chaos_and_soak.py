"""The chaos plan, the soak's verdict and the BLS's deferred release, without a server (the real runs
are tests/integration/test_chaos.py and `trtllm-pipeline bench soak`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from bench.soak.bench import Vitals, judge, log_signals
from bench.soak.command import chaos_plan
from clients.load.chaos import ChaosOutcome, ChaosPlan, ChaosTargets, run_chaos
from pipeline.errors import SpecError

MODEL_CODE = Path(__file__).resolve().parents[2] / "model_repo" / "python"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests": None, "duration_s": None}, "needs requests or duration_s"),
        ({"requests": 0}, "requests must be >= 1, got 0"),
        ({"concurrency": 0}, "concurrency must be >= 1, got 0"),
        ({"cut_fraction": 1.5}, "cut_fraction must be between 0 and 1, got 1.5"),
        ({"endpoints": ("grpc", "smtp")}, "endpoints must be some of grpc, http, openai; got grpc, smtp"),
        ({"max_tokens": (10, 5)}, "max_tokens must be a range low <= high, got 10..5"),
        ({"max_tokens": (0, 5)}, "max_tokens must start at 1 or more"),
        ({"triton_models": ()}, "triton_models must name at least one model"),
        ({"grpc_cut": "drop"}, "grpc_cut must be 'cancel' or 'stop', got 'drop'"),
    ],
)
def test_a_bad_chaos_plan_names_its_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChaosPlan(**kwargs)


def test_the_soak_command_turns_bad_arguments_into_spec_errors():
    class Args:
        requests, duration, concurrency, cut_fraction, endpoints, max_tokens, seed = None, 10.0, 4, 0.5, "grpc", "16", 0
        triton_models = "tensorrt_llm_bls"
        sample_interval, max_rss_slope = 5.0, None

    with pytest.raises(SpecError, match="--max-tokens takes LOW,HIGH"):
        chaos_plan(Args())
    Args.max_tokens, Args.cut_fraction = "4,8", 2.0
    with pytest.raises(SpecError, match="bench soak: cut_fraction must be between 0 and 1"):
        chaos_plan(Args())
    Args.cut_fraction = 0.5
    assert chaos_plan(Args()).triton_models == ("tensorrt_llm_bls",)
    Args.triton_models = " , "
    with pytest.raises(SpecError, match="bench soak: triton_models must name at least one model"):
        chaos_plan(Args())


def _vitals(**changes) -> Vitals:
    values = dict(ready=True, kv_blocks_used=0.0, active_requests=0.0, server_rss_mb=40.0, stub_rss_mb=500.0, stub_pids=(1, 2), signals=())
    values.update(changes)
    return Vitals(**values)


def test_a_clean_run_has_no_problems():
    outcome = ChaosOutcome(done=5, cut=5)
    assert judge(outcome, _vitals(), _vitals(server_rss_mb=45.0), "abc", "abc") == []


@pytest.mark.parametrize(
    ("after", "greedy_after", "failed", "expected"),
    [
        ({"ready": False}, None, 0, "not ready"),
        ({"signals": ("Signal (11) received",)}, "abc", 0, "Signal (11) received"),
        ({"stub_pids": (1, 3)}, "abc", 0, "a stub died"),
        ({"kv_blocks_used": 2.0}, "abc", 0, "2.0 KV blocks used"),
        ({}, "abd", 0, "the greedy answer changed"),
        ({}, "abc", 1, "1 request(s) failed"),
    ],
)
def test_each_kind_of_damage_is_named(after, greedy_after, failed, expected):
    outcome = ChaosOutcome(done=5, cut=5, failed=failed, errors=["grpc:ensemble: boom"] if failed else [])
    problems = judge(outcome, _vitals(), _vitals(**after), "abc", greedy_after)
    assert any(expected in problem for problem in problems), problems


def test_signals_already_in_the_log_before_the_run_do_not_count(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_text("I... ready\nSignal (11) received.\n")
    before = _vitals(signals=log_signals(log))
    assert before.signals == ("Signal (11) received",)
    assert judge(ChaosOutcome(done=1), before, _vitals(signals=before.signals), "a", "a") == []


def test_outcome_counts_per_route_and_keeps_a_bounded_error_sample():
    outcome = ChaosOutcome()
    for index in range(30):
        outcome.count("grpc:ensemble", "failed", f"error {index}")
    outcome.count("openai", "cut")
    assert outcome.sent == 31 and outcome.by_route["grpc:ensemble"]["failed"] == 30
    assert len(outcome.errors) == 20 and outcome.as_dict()["by_route"]["openai"] == {"done": 0, "cut": 1, "failed": 0}


def test_deferred_release_drops_objects_only_after_their_delay(monkeypatch):
    monkeypatch.syspath_prepend(str(MODEL_CODE))
    from deferred_release import DeferredRelease

    now = [0.0]
    released = []

    class Tracked:
        def __init__(self, name):
            self.name = name

        def __del__(self):
            released.append(self.name)

    holder = DeferredRelease(2.0, clock=lambda: now[0])
    holder.hold(Tracked("a"))
    now[0] = 1.0
    holder.hold(Tracked("b"))
    assert holder.release_due() == 0 and released == []
    now[0] = 2.5
    assert holder.release_due() == 1 and released == ["a"] and len(holder) == 1
    now[0] = 3.0
    assert holder.release_due() == 1 and released == ["a", "b"]
    sys.modules.pop("deferred_release", None)


def test_a_run_stops_early_when_told_why_and_abandons_the_hung_streams():
    """A crashed tritonserver can hang in its signal handler: nothing answers, nothing closes.
    The soak's watchdog names the reason; the open streams are abandoned, not waited for."""

    async def scenario():
        async def hang(reader, writer):
            await asyncio.sleep(60)

        server = await asyncio.start_server(hang, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        asked = []

        def stop_reason():
            asked.append(1)
            return "the server log showed Signal (6)" if len(asked) >= 2 else None

        plan = ChaosPlan(requests=50, concurrency=4, endpoints=("openai",))
        targets = ChaosTargets("127.0.0.1:1", "127.0.0.1:1", f"http://127.0.0.1:{port}", "tiny-cpu")
        try:
            return await asyncio.wait_for(run_chaos(plan, targets, stop_reason=stop_reason), timeout=20)
        finally:
            server.close()

    outcome = asyncio.run(scenario())
    assert outcome.stopped == "the server log showed Signal (6)"
    assert outcome.sent == 0 and outcome.seconds < 10


@pytest.mark.parametrize(
    ("returncode", "fatal", "expected"),
    [
        (0, None, []),
        (-6, "Signal (6) received", ["the server crashed while stopping (Signal (6) received): its heap was corrupted during the run"]),
        (1, None, ["the server exited 1 when stopped"]),
    ],
)
def test_what_the_server_did_when_stopped_joins_the_verdict(returncode, fatal, expected):
    from bench.soak.command import stop_problems

    class StoppedServer:
        fatal_signal_at_stop = fatal

        def stop(self):
            return returncode

    assert stop_problems(StoppedServer()) == expected


def stuck_log(unloaded: tuple[str, ...], stuck: tuple[str, ...]) -> str:
    """tritonserver's log of a stop that unloaded `unloaded` and timed out on `stuck`."""
    loaded = "".join(f"I1201 model_lifecycle.cc:839] \"successfully loaded '{m}'\"\n" for m in unloaded + stuck)
    gone = "".join(f"I1201 model_lifecycle.cc:624] \"successfully unloaded '{m}' version 1\"\n" for m in unloaded)
    return (
        loaded + "Signal (15) received.\n" + gone + f'server.cc:345] "Timeout 0: Found {len(stuck)} live models"\nExit timeout expired. Exiting immediately.\n'
    )


def test_only_a_stuck_ensemble_without_a_crash_is_excused_at_stop(tmp_path):
    from tests.support.serving import STUCK_ENSEMBLE, assert_stopped_cleanly

    stuck = stuck_log(("postprocessing", "preprocessing", "tensorrt_llm_bls", "tensorrt_llm"), ("ensemble",))
    log = tmp_path / "tritonserver.log"
    log.write_text(stuck)
    with pytest.warns(UserWarning, match="kept the ensemble loaded"):
        assert_stopped_cleanly(1, log, allow_stuck_ensemble=True)
    with pytest.raises(AssertionError, match="exited with 1"):
        assert_stopped_cleanly(1, log, allow_stuck_ensemble=False)  # only where the caller allows it
    log.write_text(stuck + "Signal (6) received.\n")
    with pytest.raises(AssertionError):
        assert_stopped_cleanly(1, log, allow_stuck_ensemble=True)  # a crash is never excused
    with pytest.raises(AssertionError):
        assert_stopped_cleanly(-6, log, allow_stuck_ensemble=True)
    assert "core #483" in STUCK_ENSEMBLE


def test_stuck_ensembles_of_a_combined_repository_are_excused_and_nothing_else(tmp_path):
    from tests.support.serving import assert_stopped_cleanly

    log = tmp_path / "tritonserver.log"
    log.write_text(stuck_log(("a-preprocessing", "a-tensorrt_llm", "b-preprocessing"), ("a-ensemble", "b-ensemble")))
    with pytest.warns(UserWarning, match="kept the ensemble loaded"):
        assert_stopped_cleanly(1, log)
    log.write_text(stuck_log(("a-preprocessing", "a-ensemble"), ("a-tensorrt_llm",)))
    with pytest.raises(AssertionError, match="exited with 1"):
        assert_stopped_cleanly(1, log)


def test_a_stuck_bls_is_excused_only_where_the_caller_allows_it(tmp_path):
    from tests.support.serving import STUCK_BLS, assert_stopped_cleanly

    log = tmp_path / "tritonserver.log"
    log.write_text(stuck_log(("ensemble", "postprocessing", "preprocessing", "tensorrt_llm"), ("tensorrt_llm_bls",)))
    with pytest.warns(UserWarning, match="kept tensorrt_llm_bls loaded"):
        assert_stopped_cleanly(1, log, allow_stuck_bls=True)
    with pytest.raises(AssertionError, match="exited with 1"):
        assert_stopped_cleanly(1, log)  # the default excuses only the ensemble
    log.write_text(stuck_log(("postprocessing", "preprocessing", "tensorrt_llm"), ("ensemble", "tensorrt_llm_bls")))
    with pytest.warns(UserWarning, match="kept tensorrt_llm_bls loaded"):
        assert_stopped_cleanly(1, log, allow_stuck_bls=True)
    log.write_text(stuck_log(("ensemble", "postprocessing", "preprocessing"), ("tensorrt_llm_bls", "tensorrt_llm")))
    with pytest.raises(AssertionError):
        assert_stopped_cleanly(1, log, allow_stuck_bls=True)  # the LLM model left loaded is never excused
    assert "tensorrt_llm_bls" in STUCK_BLS

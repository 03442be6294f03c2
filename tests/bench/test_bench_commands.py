"""`bench load` and `bench overhead` are the benchmarks' names; `bench serve` (the load sweep) and
`bench serve --overhead` still run the same commands, after a deprecation note on stderr."""

from __future__ import annotations

import pytest

from bench.load import command as load_command
from bench.overhead import command as overhead_command
from pipeline.cli import main
from tests.conftest import REPO

CONFIG = str(REPO / "build_configs" / "tiny-cpu.yaml")


@pytest.fixture
def ran(monkeypatch) -> dict:
    """Which command ran, with which arguments (nothing is built or measured)."""
    calls: dict = {}

    def recorder(name: str):
        def run(args, *_build) -> int:
            calls[name] = args
            return 0

        return run

    monkeypatch.setattr(load_command, "run_load_command", recorder("load"))
    monkeypatch.setattr(overhead_command, "run_overhead_command", recorder("overhead"))
    return calls


@pytest.mark.parametrize(
    ("argv", "runs", "note"),
    [
        (["bench", "load", CONFIG, "--concurrency", "1,2"], "load", None),
        (["bench", "serve", CONFIG, "--concurrency", "1,2"], "load", "note: `bench serve` is deprecated and will be removed; it runs `bench load` now"),
        (["bench", "overhead", CONFIG, "--requests", "7"], "overhead", None),
        (
            ["bench", "serve", CONFIG, "--overhead", "--requests", "7"],
            "overhead",
            "note: `bench serve --overhead` is deprecated and will be removed; it runs `bench overhead` now",
        ),
    ],
)
def test_old_and_new_names_run_the_same_command(argv, runs, note, ran, capsys, tmp_path):
    assert main(["--artifacts", str(tmp_path), *argv]) == 0
    assert list(ran) == [runs]
    err = capsys.readouterr().err
    if note is None:
        assert "deprecated" not in err
    else:
        assert err.strip() == note
    args = ran[runs]
    assert (args.concurrency, args.requests) == (("1,2", None) if runs == "load" else (None, 7))


@pytest.mark.parametrize("argv", [["bench", "overhead", CONFIG], ["bench", "serve", CONFIG, "--overhead"]])
def test_a_bad_overhead_concurrency_is_refused_before_anything_is_built(argv, capsys, tmp_path):
    assert main(["--artifacts", str(tmp_path), *argv, "--concurrency", "2,4"]) == 2
    err = capsys.readouterr().err
    assert "--concurrency of the overhead benchmark takes one integer >= 1, got '2,4'" in err
    assert not (tmp_path / "tiny-cpu").exists()


def test_the_old_name_keeps_the_load_sweeps_checks(capsys, tmp_path):
    code = main(["--artifacts", str(tmp_path), "bench", "serve", CONFIG, "--url", "127.0.0.1:1", "--endpoint", "grpc,http"])
    err = capsys.readouterr().err
    assert code == 2 and "--url measures one endpoint" in err and "it runs `bench load` now" in err

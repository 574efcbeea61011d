"""The benchmark harness: its arithmetic, its table and summary, one module run for real.

No timing is asserted: the figures are whatever this machine gives.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import types
from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench import emulator, llm, pool, unix_sink, voice_llm
from bench.harness import (
    Context,
    Goal,
    Row,
    UnavailableError,
    counted,
    format_table,
    interleave,
    quartiles,
    ratio_row,
)


def test_quartiles_of_one_and_of_many() -> None:
    assert quartiles([2.0]) == (2.0, 2.0, 2.0)
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)


def test_a_row_is_the_median_and_iqr_of_per_round_ratios() -> None:
    row = ratio_row("x.y", "a / b", [1.0, 3.0, 2.0, 5.0, 4.0], {"a_us": 10.0})
    assert (row.ratio, row.q1, row.q3, row.rounds) == (3.0, 2.0, 4.0, 5)
    with pytest.raises(ValueError, match="no rounds"):
        ratio_row("x.y", "a / b", [], {})


@pytest.mark.parametrize(
    ("goal", "met"),
    [
        (Goal("ratio", 1.2), True),
        (Goal("ratio", 1.0), False),
        (Goal("ratio", 1.2, "at_least"), False),
        (Goal("npud_mib", 40), False),
        (Goal("npud_mib", 50), True),
        (Goal("missing", 1), None),
    ],
)
def test_goals_on_the_ratio_or_a_figure(goal: Goal, met: bool | None) -> None:
    row = Row("d.rss", "a / b", 1.1, 1.0, 1.2, 3, {"npud_mib": 42.0}, goal)
    assert row.goal_met is met


def test_interleave_alternates_which_goes_first() -> None:
    calls: list[str] = []

    def subject() -> float:
        calls.append("s")
        return 2.0

    def baseline() -> float:
        calls.append("b")
        return 1.0

    assert interleave(3, subject, baseline) == ([2.0] * 3, [1.0] * 3)
    assert calls == ["s", "b", "b", "s", "s", "b"]


def test_the_table_shows_ratio_spread_goal_and_figures() -> None:
    row = Row("e.p50", "npud / floor", 3.25, 3.0, 3.5, 9, {"npud_us": 61.2}, Goal("ratio", 2))
    table = format_table([row])
    assert "e.p50" in table
    assert "3.25" in table
    assert "3-3.5" in table
    assert "ratio <= 2 (NOT met)" in table
    assert "npud / floor: npud_us 61.2" in table


def test_a_count_agrees_with_its_noun() -> None:
    assert counted(1, "client process", "client processes") == "1 client process"
    assert counted(4, "client process", "client processes") == "4 client processes"
    assert counted(0, "round") == "0 rounds"
    assert counted(1, "round") == "1 round"


def test_a_quick_table_judges_no_goal() -> None:
    missed = Row("e.p50", "npud / floor", 3.25, 3.0, 3.5, 2, {}, Goal("ratio", 2))
    met = Row("e.p99", "npud / floor", 1.5, 1.0, 2.0, 2, {}, Goal("ratio", 2))
    table = format_table([missed, met], quick=True)
    assert "met" not in table
    assert table.count("(not judged: --quick)") == 2


@pytest.mark.usefixtures("fake_modules")
def test_a_quick_run_prints_no_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench_main.main(["--quick", "--only", "good", "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert "good.one" in out
    assert "NOT met" not in out
    assert "(not judged: --quick)" in out


def _fake_module(name: str, result: list[Row] | Exception) -> types.ModuleType:
    module = types.ModuleType(f"tests_fake_bench_{name}")
    module.NAME = name  # type: ignore[attr-defined]
    module.SUMMARY = f"the {name} fake"  # type: ignore[attr-defined]

    def rows(ctx: Context) -> list[Row]:
        assert ctx.quick
        assert ctx.workdir.is_dir()
        if isinstance(result, Exception):
            raise result
        return result

    module.rows = rows  # type: ignore[attr-defined]
    return module


def _install(monkeypatch: pytest.MonkeyPatch, *modules: types.ModuleType) -> None:
    """``python -m bench`` knows ``modules`` (fakes) and nothing else."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(bench_main, "MODULES", {m.NAME: m.__name__ for m in modules})


@pytest.fixture
def fake_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    good = _fake_module(
        "good", [ratio_row("good.one", "a / b", [1.5, 2.5], {"a_ms": 3.0}, Goal("ratio", 1.0))]
    )
    bad = _fake_module("bad", RuntimeError("it broke"))
    _install(monkeypatch, good, bad)


@pytest.mark.usefixtures("fake_modules")
def test_a_run_prints_the_table_and_writes_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary_path = tmp_path / "out" / "summary.json"
    assert bench_main.main(["--quick", "--json", str(summary_path)]) == 1  # "bad" failed
    out = capsys.readouterr().out
    assert "good.one" in out
    assert "bad: FAILED: RuntimeError: it broke" in out
    assert f"summary: {summary_path}" in out
    summary = json.loads(summary_path.read_text())
    assert summary["quick"] is True
    assert summary["errors"] == {"bad": "RuntimeError: it broke"}
    assert summary["rows"][0]["name"] == "good.one"
    assert summary["rows"][0]["ratio"] == 2.0
    assert summary["rows"][0]["figures"] == {"a_ms": 3.0}


@pytest.mark.usefixtures("fake_modules")
def test_only_runs_the_named_modules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--quick", "--only", "good", "--json", str(tmp_path / "s.json")]) == 0
    assert "FAILED" not in capsys.readouterr().out


@pytest.fixture
def an_unavailable_module(monkeypatch: pytest.MonkeyPatch) -> None:
    good = _fake_module("good", [ratio_row("good.one", "a / b", [1.0], {})])
    absent = _fake_module("absent", UnavailableError("no tiny.gguf: make peer-llama"))
    _install(monkeypatch, good, absent)


@pytest.mark.usefixtures("an_unavailable_module")
def test_a_module_missing_its_build_is_skipped_saying_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make bench`` without the optional peer build: llm shows skipped, the run is
    not failed for it, and the summary says so."""
    summary_path = tmp_path / "s.json"
    assert bench_main.main(["--quick", "--json", str(summary_path)]) == 0
    out = capsys.readouterr().out
    assert "good.one" in out
    assert "absent: SKIPPED: no tiny.gguf: make peer-llama" in out
    assert "FAILED" not in out
    summary = json.loads(summary_path.read_text())
    assert summary["skipped"] == {"absent": "no tiny.gguf: make peer-llama"}
    assert summary["errors"] == {}


@pytest.mark.usefixtures("an_unavailable_module")
def test_a_module_named_with_only_that_cannot_run_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary_path = tmp_path / "s.json"
    assert bench_main.main(["--quick", "--only", "absent", "--json", str(summary_path)]) == 1
    out = capsys.readouterr().out
    assert "absent: FAILED: UnavailableError: no tiny.gguf: make peer-llama" in out
    assert json.loads(summary_path.read_text())["skipped"] == {}


def test_llm_without_its_libraries_is_unavailable_saying_how_to_build_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPUD_LLAMA_LIB", str(tmp_path))
    with pytest.raises(UnavailableError, match="make llm"):
        llm.rows(Context(quick=True, workdir=tmp_path))


def test_the_peer_build_missing_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_rtt (and voice_day --llm) find the peer build's llama-simple this way."""
    monkeypatch.setenv("NPUD_PEER_CACHE", str(tmp_path))
    with pytest.raises(UnavailableError, match=r"llama-simple is missing: .*make peer-llama"):
        voice_llm.find_peer()


@pytest.mark.usefixtures("fake_modules")
def test_unknown_modules_and_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--only", "good,nosuch"]) == 2
    assert "unknown module nosuch; choose from good, bad" in capsys.readouterr().err
    assert bench_main.main(["--list"]) == 0
    assert "good" in capsys.readouterr().out


def test_every_listed_module_is_named_as_listed() -> None:
    for name in bench_main.MODULES:
        module = bench_main.load(name)
        assert name == module.NAME
        assert module.SUMMARY
        assert callable(module.rows)


def test_the_emulator_module_runs_quick(tmp_path: Path) -> None:
    rows = emulator.rows(Context(quick=True, workdir=tmp_path))
    assert [row.name for row in rows] == [
        "emulator.slice_echo",
        "emulator.inline_echo",
        "emulator.slice_vs_inline",
        "emulator.pd_inline_echo",
        "emulator.pd_slice_echo",
    ]
    assert all(row.rounds == 3 and row.ratio > 0 for row in rows)


def test_the_unix_sink_answers_each_frame_with_its_first_bytes() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sink = threading.Thread(target=unix_sink.serve, args=(theirs,))
        sink.start()
        frame = bytes(range(256)) * 1024
        ours.sendall(unix_sink.HEADER.pack(len(frame)) + frame)
        assert ours.recv(unix_sink.ECHOED, socket.MSG_WAITALL) == frame[: unix_sink.ECHOED]
        ours.sendall(unix_sink.HEADER.pack(3) + b"abc")
        assert ours.recv(unix_sink.ECHOED) == b"abc"
        ours.shutdown(socket.SHUT_WR)
        sink.join(10)
        assert not sink.is_alive()


def test_the_pool_module_runs_quick(tmp_path: Path) -> None:
    """npud in a child; every timed allocation is checked to be a pool hit, zeroed."""
    (row,) = pool.rows(Context(quick=True, workdir=tmp_path))
    assert row.name == "pool.alloc16m"
    assert row.rounds == 3
    assert row.ratio > 0
    assert set(row.figures) == {"pooled_ms", "fresh_ms", "pooled_release_ms", "fresh_release_ms"}

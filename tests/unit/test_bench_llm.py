"""bench/llm.py's command line: what it needs is checked before npud starts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench import harness
from bench import llm as bench_llm


def test_a_missing_prerequisite_is_said_before_npud_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[Path] = []

    def missing() -> tuple[Path, Path]:
        raise harness.UnavailableError("llama-cpp-python is not installed: `make llm` installs it")

    @contextmanager
    def npud(workdir: Path) -> Iterator[str]:
        started.append(workdir)
        yield "unused"

    monkeypatch.setattr(bench_llm, "prerequisites", missing)
    monkeypatch.setattr(bench_llm, "running_npud", npud)
    with pytest.raises(SystemExit) as exited:
        bench_llm.main(["--rounds", "1"])
    assert exited.value.code == 2
    assert "python -m bench.llm: llama-cpp-python is not installed" in capsys.readouterr().err
    assert started == []  # npud was never started


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_llm.main(["--rounds", "0"])
    assert exited.value.code == 2
    assert "--rounds and --tokens must be at least 1" in capsys.readouterr().err

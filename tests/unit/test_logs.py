"""Log lines: syslog priority prefixes when stderr is the journal, stable events with fields."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
import structlog

from npud.ops import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def journal_value(stream: TextIO) -> str:
    st = os.fstat(stream.fileno())
    return f"{st.st_dev}:{st.st_ino}"


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        (logging.DEBUG, 7),
        (logging.INFO, 6),
        (logging.WARNING, 4),
        (logging.ERROR, 3),
        (logging.CRITICAL, 2),
        (logging.INFO + 5, 6),  # a custom level between two takes the lower one's
        (logging.NOTSET, 7),
    ],
)
def test_syslog_priority(level: int, priority: int) -> None:
    assert logs.syslog_priority(level) == priority


def test_stderr_is_the_journal_only_when_device_and_inode_match(tmp_path: Path) -> None:
    with open(tmp_path / "a", "w") as ours, open(tmp_path / "b", "w") as other:
        assert logs.stderr_is_journal(ours, {"JOURNAL_STREAM": journal_value(ours)})
        # Inherited by a child whose stderr goes elsewhere: not the journal.
        assert not logs.stderr_is_journal(ours, {"JOURNAL_STREAM": journal_value(other)})


@pytest.mark.parametrize("value", ["", "12", "12:", ":34", "a:b", "1:2:3", " 1:2"])
def test_a_malformed_journal_stream_is_not_the_journal(tmp_path: Path, value: str) -> None:
    with open(tmp_path / "a", "w") as ours:
        assert not logs.stderr_is_journal(ours, {"JOURNAL_STREAM": value})


def test_a_stream_without_a_descriptor_is_not_the_journal() -> None:
    assert not logs.stderr_is_journal(io.StringIO(), {"JOURNAL_STREAM": "1:2"})


def test_every_line_of_a_multi_line_record_gets_the_prefix() -> None:
    formatter = logs.JournalPrefixFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("npud", logging.WARNING, __file__, 1, "one\ntwo", None, None)
    assert formatter.format(record) == "<4>one\n<4>two"


def configure_to(
    path: Path, monkeypatch: pytest.MonkeyPatch, *, journal: bool, fmt: str = "json"
) -> TextIO:
    stream = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the caller
    monkeypatch.setattr("sys.stderr", stream)
    if journal:
        monkeypatch.setenv("JOURNAL_STREAM", journal_value(stream))
    else:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logs.configure_logging(fmt, "debug")  # type: ignore[arg-type]
    return stream


@pytest.mark.usefixtures("restore_logging")
def test_structlog_and_stdlib_lines_carry_their_priority_and_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with configure_to(path, monkeypatch, journal=True):
        structlog.get_logger("npud").warning("connection refused", pid=7)
        structlog.get_logger("npud").info("ready")
        logging.getLogger("npud.fastrpc.session").error(
            "releasing buffer failed", extra={"buffer": 3, "error": "EBADF"}
        )
        logging.getLogger("npud.fastrpc.session").debug("detail")
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<4>", "<6>", "<3>", "<7>"]
    events = [json.loads(line[3:]) for line in lines]
    assert events[0]["event"] == "connection refused"
    assert events[0]["pid"] == 7
    # The standard library's extra= becomes fields, and the event stays a stable key.
    assert events[2]["event"] == "releasing buffer failed"
    assert (events[2]["buffer"], events[2]["error"], events[2]["level"]) == (3, "EBADF", "error")


@pytest.mark.usefixtures("restore_logging")
def test_no_prefix_when_stderr_is_not_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with configure_to(path, monkeypatch, journal=False):
        structlog.get_logger("npud").warning("connection refused")
    [line] = path.read_text().splitlines()
    assert json.loads(line)["event"] == "connection refused"


@pytest.mark.usefixtures("restore_logging")
def test_a_console_traceback_stays_at_error_priority_on_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with configure_to(path, monkeypatch, journal=True, fmt="console"):
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger("npud").exception("lane job failed")
    lines = path.read_text().splitlines()
    assert len(lines) > 1
    assert all(line.startswith("<3>") for line in lines), lines


def test_print_error_is_an_error_in_the_journal_and_plain_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "a", "w") as stream:
        monkeypatch.setenv("JOURNAL_STREAM", journal_value(stream))
        logs.print_error("npud: bad configuration: x", stream=stream)
        monkeypatch.delenv("JOURNAL_STREAM")
        logs.print_error("npud: second", stream=stream)
    assert (tmp_path / "a").read_text() == "<3>npud: bad configuration: x\nnpud: second\n"

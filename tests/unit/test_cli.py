"""The command-line conventions npuctl (npu_client.cli) and npud's commands (npud.ops.cli)
share: sysexits statuses, usage errors exiting 64, a closed stdout ending quietly."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

import npud.ops.cli
from npu_client import cli as client_cli

MODULES = [client_cli, npud.ops.cli]
IDS = ["npu_client.cli", "npud.ops.cli"]


def test_the_two_agree_and_are_sysexits() -> None:
    names = [name for name in dir(npud.ops.cli) if name.startswith(("EX_", "EXIT_"))]
    assert len(names) >= 12
    for name in names:
        assert getattr(client_cli, name) == getattr(npud.ops.cli, name), name
        if name.startswith("EX_"):
            assert getattr(npud.ops.cli, name) == getattr(os, name), name
    assert (npud.ops.cli.EXIT_PIPE, npud.ops.cli.EXIT_INTERRUPTED) == (141, 130)


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_a_usage_error_exits_64_with_the_usage(
    cli: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = cli.ArgumentParser(prog="tool")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("go").add_argument("--count", type=int)
    for argv in (["stop"], ["go", "--count", "x"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 64
    err = capsys.readouterr().err
    assert err.startswith("usage: tool")
    assert "tool go: error: argument --count: invalid int value: 'x'" in err


@contextlib.contextmanager
def closed_stdout(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.TextIOWrapper]:
    """sys.stdout writing into a pipe whose reader is gone (set in the test itself: pytest
    puts its own capture back between a fixture and the test)."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w", encoding="utf-8") as stream, monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", stream)
        yield stream


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_a_closed_stdout_ends_quietly_with_141(
    cli: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def main() -> int:
        for _ in range(100):
            print("a line nobody reads " * 100)
        return 0

    with closed_stdout(monkeypatch) as stream:
        assert cli.run(main) == 141
        print("after: goes to /dev/null, raises nothing")
        stream.flush()


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_help_into_a_closed_stdout_is_141_too(
    cli: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = cli.ArgumentParser(prog="tool", description="words " * 100)
    with closed_stdout(monkeypatch):
        assert cli.run(lambda: parser.parse_args(["--help"]) and 0) == 141


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_output_that_was_read_keeps_its_status(
    cli: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def main() -> int:
        print("read")
        return 3

    assert cli.run(main) == 3
    assert capsys.readouterr().out == "read\n"


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_a_broken_pipe_of_anything_else_is_not_swallowed(cli: ModuleType) -> None:
    def main() -> int:
        raise BrokenPipeError("a socket's")

    with pytest.raises(BrokenPipeError, match="a socket's"):
        cli.run(main)


@pytest.mark.parametrize("cli", MODULES, ids=IDS)
def test_a_usage_error_into_a_closed_stdout_is_still_64(
    cli: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = cli.ArgumentParser(prog="tool")
    with closed_stdout(monkeypatch), pytest.raises(SystemExit) as exited:
        cli.run(lambda: parser.parse_args(["--nope"]) and 0)
    assert exited.value.code == 64

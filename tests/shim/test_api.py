"""Every export of npud's libcdsprpc against npud on the emulator (tests/shim/c/api_test.c).

Each scenario is a C program built with AddressSanitizer and
UndefinedBehaviorSanitizer, linked with the sanitized library; after it
exits, npud must hold nothing of it (no buffer, mapping, handle, no isolated
domain).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.daemon import Npud
from tests.shim.programs import answer, expect_line, finish, run, spawned, status, wait_until_clean


@pytest.mark.parametrize(
    "scenario",
    [
        "rpcmem",
        "dsp_memory",
        "register",
        "mmap",
        "handles",
        "controls",
        "dspqueue",
        "threads",
        "big",  # llama.cpp's 256 MiB + 4 KiB chunk, a 300 MiB tensor; past npud's largest
    ],
)
def test_scenario(api_test: Path, npud: Npud, scenario: str) -> None:
    run(api_test, scenario, npud.socket_path)
    wait_until_clean(npud)


def test_buffers_in_shared_memory_travel_by_reference(api_test: Path, npud: Npud) -> None:
    """An output in a buffer registered with one of npud's buffers' numbers is a slice
    (S); one registered with an fd npud does not know is copied (I)."""
    result = run(api_test, "register", npud.socket_path, env={"NPUD_SHIM_LOG": "2"})
    invokes = [line for line in result.stderr.splitlines() if " invoke handle " in line]
    assert [line.split(" args ")[1] for line in invokes] == ["II|S", "II|I"], result.stderr
    wait_until_clean(npud)


def test_every_call_says_how_it_travels(api_test: Path, npud: Npud) -> None:
    """rpcmem arguments are slices, plain memory inline, large plain memory spilled (P)."""
    result = run(api_test, "dsp_memory", npud.socket_path, env={"NPUD_SHIM_LOG": "2"})
    kinds = [
        line.split(" args ")[1] for line in result.stderr.splitlines() if " invoke handle " in line
    ]
    assert kinds[:2] == ["I|S", "IS|I"], kinds  # fill into rpcmem, checksum of rpcmem
    assert "IP|P" in kinds, kinds  # 3 MiB each way: beyond max_inline_bytes
    wait_until_clean(npud)


def test_fork(api_test: Path, npud: Npud, tmp_path: Path) -> None:
    """A program that forks (Python's multiprocessing does by default): the child's first
    call used the parent's connection, hung the child and ended the parent's; now the
    child starts clean with a connection of its own and the parent goes on.

    The child's leak check runs too; what the threads that do not cross a fork had
    allocated for their calls (the parent's waiting wait_signal and busy call) is the
    only thing it may find."""
    suppressions = tmp_path / "lsan.supp"
    suppressions.write_text("leak:recv_main\nleak:busy_fork_main\n")
    run(
        api_test,
        "fork",
        npud.socket_path,
        env={"LSAN_OPTIONS": f"suppressions={suppressions}:print_suppressions=0"},
    )
    wait_until_clean(npud)


def test_the_last_handle_ends_the_dsp_process(api_test: Path, npud: Npud) -> None:
    """libcdsprpc ends the DSP process when the last handle closes: so does the library
    once nothing else is held (a held buffer keeps the connection, and so the process).
    It kept the process before."""

    def isolated(pid: int) -> list[str]:
        current = status(npud.socket_path)
        return [row.domain for row in current.clients if row.pid == pid]

    with spawned(api_test, "teardown", npud.socket_path) as process:
        expect_line(process, "HELD")
        assert [d.split("#")[0] for d in isolated(process.pid)] == ["default"]
        answer(process)
        expect_line(process, "CLOSED")
        wait_until_clean(npud)  # its connection and DSP process (isolated domain) end
        answer(process)
        finish(process)
    wait_until_clean(npud)


def test_no_npud(api_test: Path, tmp_path: Path) -> None:
    """Nobody listens: every call fails at once with AEE_ECONNREFUSED (no hang)."""
    run(api_test, "refused", tmp_path / "nobody.sock", timeout=30)


def test_a_program_gets_a_dsp_process_of_its_own(api_test: Path, npud: Npud) -> None:
    """Hello: the program's name, isolate (dspqueue's state is per process); and a
    program that exits holding everything (llama.cpp never tears down) leaves npud clean."""
    with spawned(api_test, "hold", npud.socket_path) as process:
        expect_line(process, "HOLDING")
        rows = [row for row in status(npud.socket_path).clients if row.pid == process.pid]
        assert [row.name for row in rows] == ["api_test"]
        assert rows[0].domain.startswith("default#")  # a DSP process of its own
        answer(process)
        finish(process)
    wait_until_clean(npud)


def test_an_answer_a_probe_expects_is_not_logged_as_an_error(api_test: Path, npud: Npud) -> None:
    """dspqueue's first create_queue asks for a version the DSP refuses when it checks
    versions (AEE_EUNSUPPORTED): the expected answer, which NPUD_SHIM_LOG=1 printed as
    "npud: error 102 ... AEE_EUNSUPPORTED" during every successful llama.cpp run."""
    result = run(api_test, "dspqueue", npud.socket_path, env={"NPUD_SHIM_LOG": "1"})
    assert "connected to npud" in result.stderr
    assert "error" not in result.stderr, result.stderr
    wait_until_clean(npud)


def test_a_failed_call_is_still_logged(api_test: Path, npud: Npud) -> None:
    result = run(api_test, "handles", npud.socket_path, env={"NPUD_SHIM_LOG": "1"})
    assert "libcdsprpc(npud): npud: error " in result.stderr, result.stderr
    wait_until_clean(npud)

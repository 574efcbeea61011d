"""Build npud's libcdsprpc and the C programs that test it; run them; watch npud let go.

Everything is built outside the source tree, with AddressSanitizer and
UndefinedBehaviorSanitizer (a report fails the program, and a leak too: the
leak check runs at exit). gcc, make and msgpack-c's headers (libmsgpack-dev)
come from tests/tools.py: missing, they skip the test, or fail it under CI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import pytest

import npu_client
import npu_protocol as p
from tests.e2e.daemon import Npud
from tests.tools import require_file, require_tool

REPO: Final = Path(__file__).resolve().parents[2]
SHIM: Final = REPO / "shim"
INCLUDE: Final = SHIM / "include"
C_DIR: Final = Path(__file__).with_name("c")

SANITIZERS: Final = (
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=all",
)
CFLAGS: Final = (
    "-std=c11",
    "-g",
    "-O1",
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
)
SANITIZER_ENV: Final = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=66",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}


def need_compiler() -> None:
    require_tool("gcc", "gcc")
    require_tool("make", "make")
    require_file(Path("/usr/include/msgpack.h"), "libmsgpack-dev")


def make_library(out: Path, *, sanitize: bool = False, faults: bool = False) -> Path:
    """``make -C shim`` into ``out``; returns ``out`` (libcdsprpc.so.1 and the link)."""
    need_compiler()
    result = subprocess.run(
        [
            "make",
            "-j2",
            "-C",
            str(SHIM),
            f"OUT={out}",
            f"SANITIZE={int(sanitize)}",
            f"FAULTS={int(faults)}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if result.returncode != 0:
        pytest.fail(f"make -C shim failed:\n{result.stdout}\n{result.stderr}")
    return out


def compile_program(
    out: Path,
    sources: Sequence[Path],
    *,
    library: Path | None = None,
    extra: Sequence[str] = (),
    sanitize: bool = True,
) -> Path:
    """A test program from ``sources``, linked with the library in ``library`` if given."""
    need_compiler()
    command = [
        "gcc",
        *CFLAGS,
        *(SANITIZERS if sanitize else ()),
        f"-I{INCLUDE}",
        *extra,
        *map(str, sources),
        "-o",
        str(out),
    ]
    if library is not None:
        command += [f"-L{library}", "-lcdsprpc", f"-Wl,-rpath,{library}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed:\n{result.stderr}")
    return out


def environment(socket_path: Path | str | None) -> dict[str, str]:
    """The test's environment with the sanitizers' options, the socket, no stray settings."""
    env = {**os.environ, **SANITIZER_ENV}
    for name in ("NPUD_SHIM_LOG", "NPUD_SHIM_FAULT_AT", "NPUD_CLIENT_NAME", "NPUD_PRIORITY"):
        env.pop(name, None)
    if socket_path is not None:
        env["NPUD_SOCKET"] = str(socket_path)
    return env


def run(
    program: Path,
    scenario: str,
    socket_path: Path | str | None,
    *,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``program scenario``, which must exit 0 (its first failed check is the message)."""
    result = subprocess.run(
        [str(program), scenario],
        env={**environment(socket_path), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{program.name} {scenario} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    assert f"ok {scenario}" in result.stdout, result.stdout
    return result


@contextlib.contextmanager
def spawned(
    program: Path, scenario: str, socket_path: Path | str
) -> Iterator[subprocess.Popen[str]]:
    """``program scenario`` for a scenario that talks to the test on stdin and stdout;
    killed if still running when the block ends."""
    process = subprocess.Popen(
        [str(program), scenario],
        env=environment(socket_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait()


def expect_line(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdout is not None
    got = process.stdout.readline().strip()
    if got != line:
        process.kill()
        err = process.stderr.read() if process.stderr is not None else ""
        raise AssertionError(f"expected {line!r}, got {got!r}:\n{err}")


def answer(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()


def finish(process: subprocess.Popen[str], timeout: float = 60) -> str:
    """Wait for a spawned scenario; it must exit 0. Its stdout."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"exited {process.returncode}:\n{out}\n{err}"
    return out


def status(socket_path: Path | str) -> p.DaemonStatus:
    with npu_client.connect(str(socket_path), name="observer", timeout=30) as npu:
        return npu.status()


def wait_until_clean(npud: Npud, timeout: float = 20.0) -> p.DaemonStatus:
    """npud holds nothing for departed clients: no buffers, mappings or handles, no
    isolated domain (a libcdsprpc client gets one of its own), only the observer."""
    deadline = time.monotonic() + timeout
    while True:
        current = status(npud.socket_path)
        totals = current.totals
        clean = totals == p.Totals(clients=1, calls_done=totals.calls_done) and not any(
            domain.isolated for domain in current.domains
        )
        if clean:
            return current
        if time.monotonic() > deadline:
            isolated = [d.name for d in current.domains if d.isolated]
            raise AssertionError(f"npud still holds: {totals}, isolated domains {isolated}")
        time.sleep(0.05)

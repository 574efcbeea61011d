"""Child processes for benchmarks: npud on the emulator, the floor server, bare interpreters.

Every child is started and reaped by a context manager here; nothing outlives
the benchmark that started it. Children run with bytecode caching on
(``PYTHONDONTWRITEBYTECODE`` removed from their environment): an installed
npud has its modules compiled, as the baseline's site-packages are, and a
checkout that never wrote its ``.pyc`` files would pay for compiling them
at every start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import npu_client

START_TIMEOUT = 30.0
POLL_INTERVAL = 0.002

CHILD_ENVIRONMENT = {
    name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"
}

BARE_IMPORTS = "import trio, msgspec, structlog"
"""The third-party modules every npud process needs: the baseline for size and start."""


def npud_command(workdir: Path, socket_path: Path, extra_config: str = "") -> list[str]:
    config = workdir / f"{socket_path.stem}.toml"
    config.write_text(
        "[backend]\nkind = 'emulator'\n[daemon]\nlog_level = 'warning'\n" + extra_config
    )
    return [
        sys.executable, "-m", "npud.daemon.main", "--config", str(config),
        "--socket", str(socket_path), "--log-format", "json",
    ]  # fmt: skip


@contextmanager
def running(args: list[str], stderr: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` as a child with stdin and stdout on pipes, its stderr discarded or
    written to ``stderr``; terminated and reaped at exit."""
    with open(stderr or os.devnull, "wb") as error_sink:
        process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=error_sink,
            env=CHILD_ENVIRONMENT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


@contextmanager
def ready_child(
    args: list[str], what: str, cwd: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A child that prints READY once it is set up, with text pipes to and from it; killed
    and reaped on the way out. ``what`` names it in the error when it never gets ready."""
    process = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=CHILD_ENVIRONMENT,
        text=True,
        cwd=cwd,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{what} did not start")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def wait_for_hello(process: subprocess.Popen[bytes], socket_path: Path) -> float:
    """Poll until ``socket_path`` answers a Hello with a Welcome; the monotonic time it did."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with npu_client.connect(str(socket_path), name="bench-probe", timeout=START_TIMEOUT):
                return time.monotonic()
        except npu_client.ConnectFailed:
            time.sleep(POLL_INTERVAL)
    raise RuntimeError(f"{socket_path} did not answer a Hello within {START_TIMEOUT} s")


@contextmanager
def npud(workdir: Path, name: str = "npud", extra_config: str = "") -> Iterator[Path]:
    """npud on the emulator, serving; yields its socket path. ``extra_config`` is TOML
    appended to the benchmark's configuration (sections after [daemon])."""
    socket_path = workdir / f"{name}.sock"
    with running(npud_command(workdir, socket_path, extra_config)) as process:
        wait_for_hello(process, socket_path)
        yield socket_path


@contextmanager
def npud_process(
    workdir: Path, name: str = "npud", extra_config: str = "", log: Path | None = None
) -> Iterator[tuple[Path, int]]:
    """As :func:`npud`, also yielding the daemon's pid (for its CPU time); its log
    (JSON lines on stderr) goes to ``log`` when given."""
    socket_path = workdir / f"{name}.sock"
    with running(npud_command(workdir, socket_path, extra_config), stderr=log) as process:
        wait_for_hello(process, socket_path)
        yield socket_path, process.pid


@contextmanager
def same_work_server(workdir: Path, dsp_units: int = 0) -> Iterator[tuple[Path, int]]:
    """The same-work floor of bench/same_work_server.py, serving; yields (socket, pid)."""
    socket_path = workdir / "same-work.sock"
    args = [sys.executable, "-m", "bench.same_work_server", str(socket_path), str(dsp_units)]
    try:
        with running(args) as process:
            wait_for_hello(process, socket_path)
            yield socket_path, process.pid
    finally:
        socket_path.unlink(missing_ok=True)  # the floor leaves it; the next one binds it


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``, every thread included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def batch_server(workdir: Path, dsp_units: int = 0, hmx_units: int = 0) -> Iterator[Path]:
    """bench/batch_server.py (llama.cpp's batches with the least machinery), serving;
    yields its socket path."""
    socket_path = workdir / "batch-floor.sock"
    args = [
        sys.executable,
        "-m",
        "bench.batch_server",
        str(socket_path),
        str(dsp_units),
        str(hmx_units),
    ]
    try:
        with running(args) as process:
            wait_for_hello(process, socket_path)
            yield socket_path
    finally:
        socket_path.unlink(missing_ok=True)


@contextmanager
def floor_server(workdir: Path) -> Iterator[Path]:
    """The bare trio server of bench/floor_server.py, serving; yields its socket path."""
    socket_path = workdir / "floor.sock"
    with running([sys.executable, "-m", "bench.floor_server", str(socket_path)]) as process:
        wait_for_hello(process, socket_path)
        yield socket_path


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (its children, theirs, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree - {pid}


def raise_priority(pid: int, nice: int) -> int:
    """Give every thread of ``pid`` and of its descendants the host priority ``nice``
    (negative: before the host's other work); processes they start later inherit it
    from the thread that starts them. Returns the threads changed (0 where the host
    does not allow it: a negative nice needs CAP_SYS_NICE)."""
    changed = 0
    for process in {pid} | descendants(pid):
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{process}/task")]
        except OSError:
            continue
        for tid in threads:
            try:
                # Linux: PRIO_PROCESS with a thread id sets that thread's nice.
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except PermissionError:
                return 0
            except OSError:
                continue  # the thread ended meanwhile
            changed += 1
    return changed

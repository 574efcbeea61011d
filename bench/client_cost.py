"""What npu_client adds to one call, against a minimal client of the same protocol objects.

Both clients talk to the same npud (emulator backend, started here) and call
the echo skel with the same 64-byte invoke. The minimal client is the least
a correct client must do with ``npu_protocol``: build the request, let
``ClientConnection.send`` frame it, write it, ``recvmsg`` into one buffer
(with room for fds: an alloc's reply brings one, so a client that reads
with ``recv`` loses it), feed ``receive_data`` and take the reply from
``next_event``. No threads, no timeouts, no buffers or events to look
after. Whatever ``npu_client`` costs beyond it is the price of its
guarantees (pipelining from threads, send and receive deadlines, argument
checks, fd ownership, events).

The two clients take turns call by call (which goes first alternates), so
load from other processes on a shared machine falls on both alike. Every
call is timed: wall time (``perf_counter_ns``) and this thread's CPU time
(``thread_time_ns``: the client's own work; npud runs in another process).
A round is ``--calls`` such pairs; it yields each client's median and the
median of the paired differences (the two calls of a pair are adjacent in
time, so slow drifts cancel). Rows report the median over rounds of the
ratio of medians and its spread (the interquartile range), with the figures
in microseconds per call: each client's median, and the extra cost of
npu_client with its interquartile range.

Run: ``python -m bench.client_cost [--rounds N] [--calls N] [--json]``.
"""

from __future__ import annotations

import argparse
import array
import json
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import npu_client
import npu_protocol as p
from bench import harness

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
PAYLOAD = bytes(range(64))
PRIM = struct.pack("<II", len(PAYLOAD), len(PAYLOAD))  # echo's primIn: in length, out capacity
ECHO_METHOD = 2  # the first user method of a remote_handle64 skel
WARM_UP_CALLS = 300
FD_SPACE = socket.CMSG_SPACE(p.MAX_FDS_PER_FRAME * array.array("i").itemsize)
CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)


class Row(NamedTuple):
    """One result: the median per-round ratio, its spread, and the figures behind it."""

    name: str
    ratio: float
    spread: float
    figures: dict[str, float]


# --- the minimal client -------------------------------------------------------------------


class MinimalClient:
    """The least a correct client of ``npu_protocol`` does per call, for the baseline.

    One thread, one socket, no deadlines, no events: it is a yardstick, not a
    client to use (npu_client is that).
    """

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._conn = p.ClientConnection()
        self._buffer = bytearray(64 * 1024)
        self._send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="bench-minimal"))
        self._next_message()  # the Welcome
        self._handle = 0

    def open(self, uri: str) -> None:
        reply = self._call(p.OpenRequest(id=self._conn.next_request_id(), uri=uri))
        assert isinstance(reply, p.OpenReply), reply
        self._handle = reply.handle

    def echo(self, data: bytes) -> bytes | None:
        request = p.InvokeRequest(
            id=self._conn.next_request_id(),
            handle=self._handle,
            method=ECHO_METHOD,
            inputs=(p.InlineInput(data=PRIM), p.InlineInput(data=data)),
            outputs=(p.InlineOutput(capacity=len(data)),),
        )
        reply = self._call(request)
        assert isinstance(reply, p.InvokeReply), reply
        return reply.outputs[0]

    def close(self) -> None:
        self._sock.close()

    def _call(self, request: p.AnyRequest) -> object:
        self._send(request)
        return self._next_message()

    def _send(self, message: p.ClientMessage) -> None:
        data, _ = self._conn.send(message)
        self._sock.sendall(data)

    def _next_message(self) -> object:
        while True:
            event = self._conn.next_event()
            if event is not p.NEED_DATA:
                return event
            size, ancdata, _, _ = self._sock.recvmsg_into([self._buffer], FD_SPACE, CLOEXEC)
            self._conn.receive_data(bytes(self._buffer[:size]), _fds(ancdata) if ancdata else ())


def _fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


# --- measuring ------------------------------------------------------------------------------


class Round(NamedTuple):
    """One round's medians, in microseconds per call."""

    ours: float
    base: float
    extra: float
    """The median of the paired differences (each pair: two adjacent calls)."""


def time_call(call: Callable[[], object]) -> tuple[int, int]:
    """One call's wall and CPU time (this thread's: the client's own work), in ns."""
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    call()
    cpu = time.thread_time_ns() - cpu
    return time.perf_counter_ns() - wall, cpu


def interquartile(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return high - low


def one_round(
    ours: Callable[[], object], base: Callable[[], object], pairs: int, first: int
) -> tuple[Round, Round]:
    """``pairs`` pairs of adjacent calls, which client goes first alternating; the
    wall and the CPU medians of the round."""
    walls: tuple[list[int], list[int]] = ([], [])
    cpus: tuple[list[int], list[int]] = ([], [])
    for pair in range(pairs):
        order = (0, 1) if (first + pair) % 2 == 0 else (1, 0)
        for which in order:
            wall, cpu = time_call((ours, base)[which])
            walls[which].append(wall)
            cpus[which].append(cpu)
    return _round(walls), _round(cpus)


def _round(samples: tuple[list[int], list[int]]) -> Round:
    ours, base = samples
    extra = [a - b for a, b in zip(ours, base, strict=True)]
    return Round(
        statistics.median(ours) / 1000,
        statistics.median(base) / 1000,
        statistics.median(extra) / 1000,
    )


def measure(path: str, rounds: int, calls: int) -> list[Row]:
    """Interleaved rounds of ``calls`` echoes through each client; two rows of ratios."""
    results = _rounds(path, rounds, calls)
    return [
        _row("client_cost_wall", "wall", [wall for wall, _ in results]),
        _row("client_cost_cpu", "cpu", [cpu for _, cpu in results]),
    ]


def _rounds(path: str, rounds: int, calls: int) -> list[tuple[Round, Round]]:
    """Each round's (wall, CPU) medians, after a warm-up."""
    minimal = MinimalClient(path)
    try:
        with npu_client.connect(path, name="bench-client") as npu, npu.open(ECHO_URI) as echo:
            minimal.open(ECHO_URI)

            def with_client() -> object:
                out = echo.invoke(ECHO_METHOD, [PRIM, PAYLOAD], [len(PAYLOAD)])
                assert out[0] == PAYLOAD
                return out

            def with_minimal() -> object:
                out = minimal.echo(PAYLOAD)
                assert out == PAYLOAD
                return out

            one_round(with_client, with_minimal, WARM_UP_CALLS, 0)
            return [one_round(with_client, with_minimal, calls, i) for i in range(rounds)]
    finally:
        minimal.close()


def _row(name: str, unit: str, rounds: list[Round]) -> Row:
    ratios = [r.ours / r.base for r in rounds]
    extra = [r.extra for r in rounds]
    figures = {
        f"npu_client_{unit}_us": statistics.median(r.ours for r in rounds),
        f"minimal_{unit}_us": statistics.median(r.base for r in rounds),
        f"extra_{unit}_us": statistics.median(extra),
        f"extra_{unit}_us_iqr": interquartile(extra),
        "rounds": float(len(rounds)),
    }
    return Row(name, statistics.median(ratios), interquartile(ratios), figures)


# --- npud, started for the benchmark ------------------------------------------------------


@contextmanager
def running_npud(directory: Path) -> Iterator[str]:
    """npud on the emulator, on a socket in ``directory``; stopped (SIGTERM) on exit."""
    path = directory / "npud.sock"
    config = directory / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n[daemon]\nlog_level = 'warning'\n")
    args = [
        sys.executable,
        "-m",
        "npud.daemon.main",
        "--config",
        str(config),
        "--socket",
        str(path),
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_serving(process, str(path))
        yield str(path)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_serving(process: subprocess.Popen[bytes], path: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"npud exited with {process.returncode} before serving")
        try:
            with npu_client.connect(path, name="bench-probe", timeout=5):
                return
        except npu_client.ConnectFailed:
            time.sleep(0.05)
    raise SystemExit(f"npud never accepted a connection on {path}")


def run(rounds: int = 21, calls: int = 500) -> list[Row]:
    """Start npud, measure, stop it; the rows."""
    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp, running_npud(Path(tmp)) as path:
        return measure(path, rounds, calls)


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "client_cost"
SUMMARY = "one 64-byte echo: what npu_client adds over a minimal client of the same protocol"
EXTRA_CPU_GOAL_US = 15.0  # issue 10: the client's own CPU within 15 us of a bare client


def rows(ctx: harness.Context) -> list[harness.Row]:
    """The same measurement as :func:`main`, as the harness's rows."""
    with running_npud(ctx.workdir) as path:
        results = _rounds(path, ctx.rounds(21, 5), ctx.rounds(500, 100))
    return [
        _harness_row("wall", [wall for wall, _ in results], None),
        _harness_row(
            "cpu", [cpu for _, cpu in results], harness.Goal("extra_cpu_us", EXTRA_CPU_GOAL_US)
        ),
    ]


def _harness_row(unit: str, rounds: list[Round], goal: harness.Goal | None) -> harness.Row:
    return harness.ratio_row(
        f"client_cost.{unit}",
        f"npu_client / minimal client, {unit} time per 64-byte echo",
        [r.ours / r.base for r in rounds],
        {
            f"npu_client_{unit}_us": statistics.median(r.ours for r in rounds),
            f"minimal_{unit}_us": statistics.median(r.base for r in rounds),
            f"extra_{unit}_us": statistics.median(r.extra for r in rounds),
        },
        goal,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.client_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds (default 21)")
    parser.add_argument("--calls", type=int, default=500, help="echo calls per client per round")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    rows = run(args.rounds, args.calls)
    if args.json:
        print(json.dumps([row._asdict() for row in rows], indent=2))
        return 0
    print(f"one 64-byte echo: npu_client vs a minimal client, {args.rounds} rounds x {args.calls}")
    for row in rows:
        unit = "wall" if row.name.endswith("wall") else "cpu"
        ours, theirs = row.figures[f"npu_client_{unit}_us"], row.figures[f"minimal_{unit}_us"]
        extra, extra_iqr = row.figures[f"extra_{unit}_us"], row.figures[f"extra_{unit}_us_iqr"]
        print(
            f"  {row.name:17} ratio {row.ratio:5.2f}x (IQR {row.spread:4.2f})   "
            f"npu_client {ours:6.1f} us  minimal {theirs:6.1f} us  "
            f"extra {extra:+6.1f} us (IQR {extra_iqr:4.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

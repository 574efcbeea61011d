"""The trial of a shared-memory call path (issue 22, item 5), decided by measurement.

Question: would carrying a connection's invokes through shared memory (a memfd given
at hello, woken by eventfd) instead of the socket at least halve the time npud adds to
a call over an in-process ``FastRpcSession.invoke``? And if what remains is the
interpreter, what would a native fast path save?

Four ways to make the same 64-byte echo invoke on the same emulator, timed call by
call in rounds that rotate their order (so load on a shared machine falls on all):

- ``inproc``: ``FastRpcSession.invoke`` in this process, no transport at all;
- ``ring``: the same-work floor (decode, the same invoke, encode) behind shared memory
  and eventfds (bench/ring_server.py), from a minimal client;
- ``socket``: the same-work floor behind the socket (bench/same_work_server.py), from
  the same minimal client (bench/client_cost.py);
- ``npud``: npud from npu_client, what a client gets today.

``socket - ring`` is what the ring saves on the transport, with the per-call work
identical on both sides; ``npud - inproc`` is the time npud adds. The ring is worth
adopting if the first is at least half the second (the ``ring_saves_share`` goal).

The native question, measured the same way: a 64-byte echo served by a Python loop
(``recv``/``send``, nothing else) and by the same loop in C (bench/native/echo_server.c,
built here with the system's C compiler), from the same Python client. The difference
is what the interpreter costs a server per round trip, the most a native fast path on
the daemon's side could save on it; the client's share is measured by client_cost.
"""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Protocol

import npu_client
import npu_protocol as p
from bench.client_cost import ECHO_METHOD, ECHO_URI, PAYLOAD, PRIM, MinimalClient
from bench.harness import Context, Goal, Row, median, ratio_row
from bench.processes import npud, running, same_work_server
from bench.ring_server import SLOT, put, take
from bench.same_work_server import open_session
from npu_client.transport import fds_ancillary
from npud.fastrpc import abi
from npud.fastrpc.invoke_args import Capacity, Inline

NAME = "ring_trial"
SUMMARY = "shared-memory call path trial: ring vs socket on the same work; C vs Python echo"

NATIVE_SOURCE: Final = Path(__file__).parent / "native" / "echo_server.c"
WARM_UP: Final = 200


class _Peer(Protocol):
    def echo(self, data: bytes) -> bytes | None: ...
    def close(self) -> None: ...


class RingClient(MinimalClient):
    """The minimal client with bench/ring_server.py's slots for a transport."""

    def __init__(self, path: Path) -> None:  # no super().__init__: no socket to connect
        memfd = os.memfd_create("ring-trial", os.MFD_CLOEXEC)
        requests = os.eventfd(0, os.EFD_CLOEXEC)
        replies = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            os.ftruncate(memfd, 2 * SLOT)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
                sock.sendmsg([b"\0"], fds_ancillary([memfd, requests, replies]))
            self._memory = mmap.mmap(memfd, 2 * SLOT)
        finally:
            os.close(memfd)
        self._requests, self._replies = requests, replies
        self._greet()
        self.open(ECHO_URI)

    def close(self) -> None:
        put(self._memory, 0, b"", self._requests)  # the end
        self._memory.close()
        os.close(self._requests)
        os.close(self._replies)

    def _send(self, message: p.ClientMessage) -> None:
        data, _ = self._conn.send(message)
        put(self._memory, 0, data, self._requests)

    def _next_message(self) -> object:
        while True:
            event = self._conn.next_event()
            if event is not p.NEED_DATA:
                return event
            self._conn.receive_data(take(self._memory, SLOT, self._replies))


class InProcess:
    """The echo invoke on an emulator in this process: no transport."""

    def __init__(self) -> None:
        self._session = open_session(0)
        self._handle = self._session.remote_open(ECHO_URI)
        self._sc = abi.remote_scalars_make(ECHO_METHOD, 2, 1)

    def echo(self, data: bytes) -> bytes | None:
        result = self._session.invoke(
            self._handle, self._sc, [Inline(PRIM), Inline(data)], [Capacity(len(data))]
        )
        return result.outputs[0]

    def close(self) -> None:
        self._session.close()


class Npud:
    def __init__(self, path: Path) -> None:
        self._client = npu_client.connect(str(path), name="ring-trial-npud")
        self._handle = self._client.open(ECHO_URI)

    def echo(self, data: bytes) -> bytes | None:
        return self._handle.invoke(ECHO_METHOD, [PRIM, data], [len(data)])[0]

    def close(self) -> None:
        self._client.close()


class EchoPeer:
    """A bare 64-byte round trip over a Unix socket (the native question)."""

    def __init__(self, path: Path) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(str(path))

    def echo(self, data: bytes) -> bytes | None:
        self._sock.sendall(data)
        return self._sock.recv(len(data))

    def close(self) -> None:
        self._sock.close()


def _rounds(
    subjects: dict[str, Callable[[bytes], bytes | None]], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per subject, each round's median call time in µs; the order rotates per round."""
    for echo in subjects.values():
        for _ in range(WARM_UP):
            echo(PAYLOAD)
    names = list(subjects)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            echo, samples = subjects[name], []
            for _ in range(calls):
                start = time.perf_counter_ns()
                out = echo(PAYLOAD)
                samples.append((time.perf_counter_ns() - start) / 1000)
                if out != PAYLOAD:
                    raise AssertionError(f"{name}: the echo came back different")
            medians[name].append(median(samples))
    return medians


def _measure(peers: dict[str, _Peer], rounds: int, calls: int) -> dict[str, list[float]]:
    """:func:`_rounds` over ``peers``, which are closed after, whatever happens."""
    try:
        return _rounds({name: peer.echo for name, peer in peers.items()}, rounds, calls)
    finally:
        for peer in peers.values():
            peer.close()


@contextmanager
def _ring_server(workdir: Path) -> Iterator[Path]:
    path = workdir / "ring.sock"
    with running([sys.executable, "-m", "bench.ring_server", str(path)]) as process:
        _ready(process)
        yield path
    path.unlink(missing_ok=True)


@contextmanager
def _echo_server(args: list[str], path: Path) -> Iterator[Path]:
    with running([*args, str(path)]) as process:
        _ready(process)
        yield path
    path.unlink(missing_ok=True)


def _ready(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != b"READY":
        raise RuntimeError(f"{process.args!r} did not start: {line!r}")


def _native_echo(workdir: Path) -> list[str]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the native echo needs a C compiler (cc or gcc)")
    binary = workdir / "echo_server"
    subprocess.run(
        [compiler, "-O2", "-Wall", "-Werror", "-o", str(binary), str(NATIVE_SOURCE)], check=True
    )
    return [str(binary)]


def transport_row(ctx: Context) -> Row:
    rounds, calls = ctx.rounds(9, 3), ctx.rounds(400, 100)
    ctx.progress("ring trial: in-process, ring, socket and npud echo")
    with (
        npud(ctx.workdir) as npud_path,
        same_work_server(ctx.workdir) as (socket_path, _),
        _ring_server(ctx.workdir) as ring_path,
    ):
        peers: dict[str, _Peer] = {
            "inproc": InProcess(),
            "ring": RingClient(ring_path),
            "socket": _minimal(socket_path),
            "npud": Npud(npud_path),
        }
        medians = _measure(peers, rounds, calls)
    figures = {f"{name}_us": median(values) for name, values in medians.items()}
    saves = [s - r for s, r in zip(medians["socket"], medians["ring"], strict=True)]
    added = [n - i for n, i in zip(medians["npud"], medians["inproc"], strict=True)]
    figures["ring_saves_us"] = median(saves)
    figures["npud_adds_us"] = median(added)
    figures["ring_saves_share"] = median([s / a for s, a in zip(saves, added, strict=True)])
    return ratio_row(
        "ring_trial.transport",
        "socket p50 / ring p50 (the same-work floor behind each)",
        [s / r for s, r in zip(medians["socket"], medians["ring"], strict=True)],
        figures,
        Goal("ring_saves_share", 0.5, "at_least"),
    )


def _minimal(path: Path) -> MinimalClient:
    client = MinimalClient(str(path))
    client.open(ECHO_URI)
    return client


def native_row(ctx: Context) -> Row:
    rounds, calls = ctx.rounds(9, 3), ctx.rounds(2000, 300)
    ctx.progress("ring trial: a Python and a C echo server")
    python = [sys.executable, "-m", "bench.ring_trial"]
    with (
        _echo_server(python, ctx.workdir / "py-echo.sock") as py_path,
        _echo_server(_native_echo(ctx.workdir), ctx.workdir / "c-echo.sock") as c_path,
    ):
        peers: dict[str, _Peer] = {"python": EchoPeer(py_path), "c": EchoPeer(c_path)}
        medians = _measure(peers, rounds, calls)
    figures = {f"{name}_us": median(values) for name, values in medians.items()}
    figures["interpreter_us"] = median(
        [py - c for py, c in zip(medians["python"], medians["c"], strict=True)]
    )
    return ratio_row(
        "ring_trial.native_echo",
        "Python echo server p50 / C echo server p50 (64 bytes, same Python client)",
        [py / c for py, c in zip(medians["python"], medians["c"], strict=True)],
        figures,
    )


def rows(ctx: Context) -> list[Row]:
    return [transport_row(ctx), native_row(ctx)]


def python_echo_server(path: str) -> None:
    """The Python twin of bench/native/echo_server.c: one connection, recv and send."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        print("READY", flush=True)
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)


if __name__ == "__main__":
    python_echo_server(sys.argv[1])

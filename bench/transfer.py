"""16 MiB handed to the DSP by fd (a DMA-BUF slice) beside the same bytes through a socket.

``transfer.16m`` (the issue's row). Subject: one invoke through npud (emulator, a
child process) whose input is a 16 MiB slice of a DMA-BUF, to the echo skel asked for
64 bytes back: the skel reads only those, so what is measured is what passing 16 MiB
*by fd* costs (the request carries the buffer's id, the kernel, here the emulator,
maps the pages). Baseline: the same 16 MiB sent through a plain Unix socket pair with
no npud, to a child process (bench/unix_sink.py) that receives all of it into one
reused buffer and answers with its first 64 bytes. In both, the 16 MiB are in the
client's memory before the round (a producer that shares memory writes straight into
the DMA-BUF). Each call checks the 64 bytes that come back; a round is the median of
several calls of each. Ratio: socket time / by-fd time. Figure ``inline_echo_ms``: the
same echo with 64 inline bytes and no slice, the floor of any invoke through npud,
measured beside the by-fd calls: by_fd_ms minus it is what the 16 MiB argument costs.

``transfer.16m_checksum`` (kept from before: what the fd buys when the DSP does read
everything). Subject: write 16 MiB into the DMA-BUF and have the DSP checksum the
slice. Baseline: the same bytes sent inline through npud in chunks of the largest
inline size, checksummed by the same skel. Ratio: inline / by fd.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import npu_client
from bench.harness import Context, Goal, Row, interleave, median, ratio_row
from bench.processes import npud, running
from bench.unix_sink import ECHOED, HEADER

NAME = "transfer"
SUMMARY = "16 MiB argument: by fd (DMA-BUF slice) vs a plain Unix socket; and checksummed"

ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
BIG: Final = 16 * 1024 * 1024
CALLS_BY_FD: Final = 21
CALLS_BY_SOCKET: Final = 5
"""Calls per round (a round's figure is their median): about as long on both sides."""


def rows(ctx: Context) -> list[Row]:
    payload = os.urandom(BIG)
    with npud(ctx.workdir) as path, _unix_sink(ctx.workdir) as sink:
        by_fd, by_socket, inline = _measure_by_fd(path, sink, ctx.rounds(9, 3), payload)
        summed_fd, summed_inline = _measure_checksum(path, ctx.rounds(5, 2), payload)
    return [
        ratio_row(
            "transfer.16m",
            "Unix socket time / by-fd time (16 MiB argument, 64 bytes read back)",
            [s / f for f, s in zip(by_fd, by_socket, strict=True)],
            {
                "by_fd_ms": median(by_fd) * 1000,
                "socket_ms": median(by_socket) * 1000,
                "inline_echo_ms": median(inline) * 1000,
            },
            Goal("ratio", 50, "at_least"),
        ),
        ratio_row(
            "transfer.16m_checksum",
            "inline time / by-fd time (16 MiB written and checksummed by the DSP)",
            [i / f for f, i in zip(summed_fd, summed_inline, strict=True)],
            {"by_fd_ms": median(summed_fd) * 1000, "inline_ms": median(summed_inline) * 1000},
        ),
    ]


@contextmanager
def _unix_sink(workdir: Path) -> Iterator[socket.socket]:
    """bench/unix_sink.py as a child, connected; yields our end of the connection."""
    address = str(workdir / "sink.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(address)
        listener.listen(1)
        listener.settimeout(30)
        with running([sys.executable, "-m", "bench.unix_sink", address]):
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(30)
                yield connection


def _measure_by_fd(
    path: Path, sink: socket.socket, rounds: int, payload: bytes
) -> tuple[list[float], list[float], list[float]]:
    """Per round: the by-fd call's median, the socket's, and a 64-byte inline echo's."""
    expected = payload[:ECHOED]
    header = HEADER.pack(len(payload))
    prim = struct.pack("<II", BIG, ECHOED)
    with (
        npu_client.connect(str(path), name="bench-16m") as client,
        client.open(ECHO_URI) as echo,
        client.alloc(BIG) as buf,
    ):
        view = buf.view()
        view[:] = payload  # the producer wrote it there
        view.release()
        argument = buf.slice(0, BIG)

        def one_by_fd() -> float:
            start = time.perf_counter()
            out = echo.invoke(2, [prim, argument], [ECHOED])
            elapsed = time.perf_counter() - start
            _check(out[0] == expected, "the echo of the slice came back different")
            return elapsed

        def one_by_socket() -> float:
            start = time.perf_counter()
            sink.sendall(header)
            sink.sendall(payload)
            answer = _receive(sink, ECHOED)
            elapsed = time.perf_counter() - start
            _check(answer == expected, "the socket's far end answered different bytes")
            return elapsed

        small_prim, small = struct.pack("<II", ECHOED, ECHOED), payload[:ECHOED]
        inline_calls: list[float] = []

        def one_inline() -> float:
            start = time.perf_counter()
            out = echo.invoke(2, [small_prim, small], [ECHOED])
            elapsed = time.perf_counter() - start
            _check(out[0] == expected, "the inline echo came back different")
            return elapsed

        def by_fd() -> float:
            # Beside it, outside the ratio: the same call with 64 inline bytes and no
            # slice, the floor of any invoke through npud (the 16 MiB cost the rest).
            inline_calls.append(median([one_inline() for _ in range(CALLS_BY_FD)]))
            return median([one_by_fd() for _ in range(CALLS_BY_FD)])

        def by_socket() -> float:
            return median([one_by_socket() for _ in range(CALLS_BY_SOCKET)])

        by_fd()  # warm up: the skel, the emulator's mapping, the sink's buffer
        by_socket()
        inline_calls.clear()
        by_fd_times, socket_times = interleave(rounds, by_fd, by_socket)
        return by_fd_times, socket_times, inline_calls


def _measure_checksum(path: Path, rounds: int, payload: bytes) -> tuple[list[float], list[float]]:
    expected = zlib.crc32(payload)
    with (
        npu_client.connect(str(path), name="bench-16m-sum") as client,
        client.open(TEST_URI) as test,
        client.alloc(BIG) as buf,
    ):
        chunk = client.limits.max_inline_bytes - 64
        buf.map()

        def by_fd() -> float:
            start = time.perf_counter()
            buf.view()[:] = payload  # the producer writes into shared memory
            out = test.invoke(3, [struct.pack("<I", BIG), buf.slice(0, BIG)], [4])
            elapsed = time.perf_counter() - start
            _check(_crc(out[0]) == expected, "the DSP's checksum of the slice is wrong")
            return elapsed

        def inline() -> float:
            start = time.perf_counter()
            crc = 0
            for offset in range(0, BIG, chunk):
                piece = payload[offset : offset + chunk]
                out = test.invoke(3, [struct.pack("<I", len(piece)), piece], [4])
                _check(_crc(out[0]) == zlib.crc32(piece), "a chunk's checksum is wrong")
                crc = zlib.crc32(piece, crc)
            elapsed = time.perf_counter() - start
            _check(crc == expected, "the chunks' checksum is wrong")
            return elapsed

        return interleave(rounds, by_fd, inline)


def _receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = sock.recv(count - len(data))
        if not more:
            raise AssertionError("the socket's far end closed")
        data += more
    return data


def _crc(output: bytes | None) -> int:
    if output is None:
        raise AssertionError("an inline output came back as a buffer slice")
    (crc,) = struct.unpack("<I", output)
    return int(crc)


def _check(ok: bool, failure: str) -> None:
    if not ok:
        raise AssertionError(failure)

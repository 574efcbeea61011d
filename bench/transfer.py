"""16 MiB handed to the DSP by fd (a DMA-BUF slice) beside sending it through the socket.

Each round writes 16 MiB of random bytes into a DMA-BUF and has the DSP
checksum the slice, and sends the same bytes inline through the socket in
chunks of the largest inline size, checksummed by the same skel. The ratio
is the time of the inline round over the by-fd round: how much faster
sharing memory is.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import npu_client
from bench.harness import Context, Row, interleave, median, ratio_row
from bench.processes import npud

NAME = "transfer"
SUMMARY = "16 MiB to the DSP and checksummed: by fd (DMA-BUF slice) vs inline through the socket"

TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
BIG = 16 * 1024 * 1024


def rows(ctx: Context) -> list[Row]:
    rounds = ctx.rounds(5, 2)
    payload = os.urandom(BIG)
    expected = zlib.crc32(payload)
    with npud(ctx.workdir) as path:
        by_fd, inline = _measure(path, rounds, payload, expected)
    return [
        ratio_row(
            "transfer.16m",
            "inline time / by-fd time (16 MiB, checksummed by the DSP)",
            [i / f for i, f in zip(inline, by_fd, strict=True)],
            {"by_fd_ms": median(by_fd) * 1000, "inline_ms": median(inline) * 1000},
        )
    ]


def _measure(
    path: Path, rounds: int, payload: bytes, expected: int
) -> tuple[list[float], list[float]]:
    with npu_client.connect(str(path), name="bench-16m") as client, client.open(TEST_URI) as test:
        chunk = client.limits.max_inline_bytes - 64
        with client.alloc(BIG) as buf:
            buf.map()

            def by_fd() -> float:
                start = time.perf_counter()
                buf.view()[:] = payload  # the producer writes into shared memory
                out = test.invoke(3, [struct.pack("<I", BIG), buf.slice(0, BIG)], [4])
                elapsed = time.perf_counter() - start
                _check(_crc(out[0]), expected)
                return elapsed

            def inline() -> float:
                start = time.perf_counter()
                crc = 0
                for offset in range(0, BIG, chunk):
                    piece = payload[offset : offset + chunk]
                    out = test.invoke(3, [struct.pack("<I", len(piece)), piece], [4])
                    _check(_crc(out[0]), zlib.crc32(piece))
                    crc = zlib.crc32(piece, crc)
                elapsed = time.perf_counter() - start
                _check(crc, expected)
                return elapsed

            return interleave(rounds, by_fd, inline)


def _crc(output: bytes | None) -> int:
    if output is None:
        raise AssertionError("an inline output came back as a buffer slice")
    (crc,) = struct.unpack("<I", output)
    return int(crc)


def _check(actual: int, expected: int) -> None:
    if actual != expected:
        raise AssertionError(f"checksum {actual:#x}, expected {expected:#x}")

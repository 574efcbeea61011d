"""64-byte echo round trip through npud (emulator) beside the floor server.

The floor (bench/floor_server.py) is a bare trio server speaking npud's
framing that echoes without a DSP: the ratio is what npud, its lanes and the
emulated driver add to a round trip. Both are driven by the blocking client,
in rounds that alternate which goes first; each round's ratio is npud's p50
over the floor's p50.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import npu_client
from bench.harness import Context, Row, interleave, median, ratio_row
from bench.processes import floor_server, npud

NAME = "echo"
SUMMARY = "64-byte echo round trip: npud (emulator) vs a bare trio server (the floor)"

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DATA = bytes(range(64))
PRIM = struct.pack("<II", 64, 64)


class _Echoer:
    """One connection and one open echo handle; times ``calls`` round trips per round."""

    def __init__(self, path: Path, calls: int) -> None:
        self._client = npu_client.connect(str(path), name="bench-echo")
        self._echo = self._client.open(ECHO_URI)
        self._calls = calls
        self.samples: list[float] = []
        for _ in range(min(200, calls)):  # warm up both ends
            self._echo.invoke(2, [PRIM, DATA], [64])

    def round(self) -> float:
        """The p50 of one round's calls, in µs; every sample is kept for the p99."""
        samples = []
        for _ in range(self._calls):
            start = time.perf_counter_ns()
            out = self._echo.invoke(2, [PRIM, DATA], [64])
            samples.append((time.perf_counter_ns() - start) / 1000)
            if out[0] != DATA:
                raise AssertionError("the echo came back different")
        self.samples.extend(samples)
        return median(samples)

    def close(self) -> None:
        self._echo.close()
        self._client.close()


def rows(ctx: Context) -> list[Row]:
    rounds = ctx.rounds(9, 3)
    calls = ctx.rounds(400, 100)
    with npud(ctx.workdir) as npud_path, floor_server(ctx.workdir) as floor_path:
        subject, baseline = _Echoer(npud_path, calls), _Echoer(floor_path, calls)
        try:
            npud_p50, floor_p50 = interleave(rounds, subject.round, baseline.round)
        finally:
            subject.close()
            baseline.close()
    return [
        ratio_row(
            "echo.p50",
            "npud p50 / floor p50 (64-byte echo, blocking client)",
            [n / f for n, f in zip(npud_p50, floor_p50, strict=True)],
            {
                "npud_p50_us": median(npud_p50),
                "floor_p50_us": median(floor_p50),
                "npud_p99_us": _p99(subject.samples),
                "floor_p99_us": _p99(baseline.samples),
            },
        )
    ]


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

"""The dispatch path: a 64-byte echo through npud vs the same-work floor.

The floor (bench/same_work_server.py) does what npud does for a call with the
least machinery: one blocking thread per connection, the same protocol
objects, the same ``FastRpcSession.invoke`` on the same emulator. Both are
driven by the same blocking client; rounds alternate which goes first. Rows:

* ``dispatch.p50`` / ``dispatch.p99``: npud's latency over the floor's
  (goals 1.3 and 1.5);
* ``dispatch.cpu``: the daemon's CPU time per call over the floor's (goal 1.5);
* ``dispatch.rate_N``: aggregate calls per second with N client processes
  looping echoes, npud over the floor (goal at least 0.8).

Run alone with ``python -m bench --only dispatch``.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import npu_client
from bench.harness import Context, Goal, Row, counted, interleave, median, ratio_row
from bench.processes import CHILD_ENVIRONMENT, cpu_seconds, npud_process, same_work_server

NAME = "dispatch"
SUMMARY = "64-byte echo through npud vs the same-work floor: latency, CPU per call, calls/s"

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DATA = bytes(range(64))
PRIM = struct.pack("<II", 64, 64)

LOOPER = """
import json, struct, sys, time, npu_client
uri, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
data, prim = bytes(range(64)), struct.pack("<II", 64, 64)
with npu_client.connect(path, name="bench-looper") as npu, npu.open(uri) as echo:
    for _ in range(50):
        echo.invoke(2, [prim, data], [64])
    print("READY", flush=True)
    sys.stdin.readline()
    calls, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        echo.invoke(2, [prim, data], [64])
        calls += 1
    print(json.dumps({"calls": calls}), flush=True)
"""


class _Echoer:
    def __init__(self, path: Path, pid: int, calls: int) -> None:
        self._client = npu_client.connect(str(path), name="bench-dispatch")
        self._echo = self._client.open(ECHO_URI)
        self._pid = pid
        self._calls = calls
        self.samples: list[float] = []
        self.cpu_per_call: list[float] = []
        for _ in range(min(300, calls)):
            self._echo.invoke(2, [PRIM, DATA], [64])

    def round(self) -> float:
        """p50 of one round, µs; keeps every sample and the server's CPU per call."""
        samples = []
        cpu = cpu_seconds(self._pid)
        for _ in range(self._calls):
            start = time.perf_counter_ns()
            self._echo.invoke(2, [PRIM, DATA], [64])
            samples.append((time.perf_counter_ns() - start) / 1000)
        self.cpu_per_call.append((cpu_seconds(self._pid) - cpu) / self._calls * 1e6)
        self.samples.extend(samples)
        return median(samples)

    def close(self) -> None:
        self._echo.close()
        self._client.close()


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _rate(path: Path, clients: int, seconds: float) -> float:
    """Aggregate calls per second of ``clients`` processes looping echoes."""
    loopers = [
        subprocess.Popen(
            [sys.executable, "-c", LOOPER, ECHO_URI, str(path), str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=CHILD_ENVIRONMENT,
            text=True,
        )
        for _ in range(clients)
    ]
    try:
        for looper in loopers:
            assert looper.stdout is not None
            if looper.stdout.readline().strip() != "READY":
                raise RuntimeError("a looper did not start")
        for looper in loopers:  # go, all at once
            assert looper.stdin is not None
            looper.stdin.write("\n")
            looper.stdin.flush()
        total = 0
        for looper in loopers:
            assert looper.stdout is not None
            total += json.loads(looper.stdout.readline())["calls"]
        return total / seconds
    finally:
        for looper in loopers:
            looper.wait(60)
            for pipe in (looper.stdin, looper.stdout):
                if pipe is not None:
                    pipe.close()


def rows(ctx: Context) -> list[Row]:
    rounds = ctx.rounds(11, 3)
    calls = ctx.rounds(1500, 300)
    result: list[Row] = []
    with (
        npud_process(ctx.workdir) as (npud_path, npud_pid),
        same_work_server(ctx.workdir) as (floor_path, floor_pid),
    ):
        ctx.progress("latency and CPU per call")
        subject, baseline = (
            _Echoer(npud_path, npud_pid, calls),
            _Echoer(floor_path, floor_pid, calls),
        )
        try:
            npud_p50, floor_p50 = interleave(rounds, subject.round, baseline.round)
        finally:
            subject.close()
            baseline.close()
        result.append(
            ratio_row(
                "dispatch.p50",
                "npud p50 / same-work floor p50 (64-byte echo)",
                [n / f for n, f in zip(npud_p50, floor_p50, strict=True)],
                {"npud_p50_us": median(npud_p50), "floor_p50_us": median(floor_p50)},
                Goal("ratio", 1.3, "at_most"),
            )
        )
        result.append(
            ratio_row(
                "dispatch.p99",
                "npud p99 / same-work floor p99 (per round)",
                _per_round_p99(subject.samples, baseline.samples, rounds),
                {"npud_p99_us": _p99(subject.samples), "floor_p99_us": _p99(baseline.samples)},
                Goal("ratio", 1.5, "at_most"),
            )
        )
        result.append(
            ratio_row(
                "dispatch.cpu",
                "npud CPU per call / same-work floor CPU per call",
                [
                    n / f if f else float("inf")
                    for n, f in zip(subject.cpu_per_call, baseline.cpu_per_call, strict=True)
                ],
                {
                    "npud_cpu_us": median(subject.cpu_per_call),
                    "floor_cpu_us": median(baseline.cpu_per_call),
                },
                Goal("ratio", 1.5, "at_most"),
            )
        )
        seconds = 2.0 if not ctx.quick else 0.5
        for clients in (1, 4, 16):
            processes = counted(clients, "client process", "client processes")
            ctx.progress(f"calls per second, {processes}")
            npud_rate, floor_rate = interleave(
                ctx.rounds(5, 2),
                _bind(_rate, npud_path, clients, seconds),
                _bind(_rate, floor_path, clients, seconds),
            )
            result.append(
                ratio_row(
                    f"dispatch.rate_{clients}",
                    f"npud calls/s / floor calls/s, {processes}",
                    [n / f for n, f in zip(npud_rate, floor_rate, strict=True)],
                    {
                        "npud_calls_per_s": median(npud_rate),
                        "floor_calls_per_s": median(floor_rate),
                    },
                    Goal("ratio", 0.8, "at_least"),
                )
            )
    return result


def _bind(fn: Callable[[Path, int, float], float], *args: object) -> Callable[[], float]:
    return lambda: fn(*args)  # type: ignore[arg-type]


def _per_round_p99(subject: list[float], baseline: list[float], rounds: int) -> list[float]:
    size_s, size_b = len(subject) // rounds, len(baseline) // rounds
    return [
        _p99(subject[i * size_s : (i + 1) * size_s]) / _p99(baseline[i * size_b : (i + 1) * size_b])
        for i in range(rounds)
    ]

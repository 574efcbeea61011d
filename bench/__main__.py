"""npud benchmarks, baselines in the same run, ratios printed.

1. Invoke round trip of a 64-byte echo with the blocking client, through npud
   (emulator backend) and through the floor server (bare trio framing, no
   DSP): p50 and p99 of each, and npud's overhead as a ratio of the floor.
2. 16 MiB handed to the DSP: by fd (a DMA-BUF slice; the DSP reads the shared
   memory) beside sending the same bytes through the socket as inline
   arguments, both checksummed by the same skel: the time ratio.

Everything runs in one process tree: this process is the client, npud and the
floor server are its children. Absolute times on a shared machine mean
little; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import npu_client

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
BIG = 16 * 1024 * 1024


@contextmanager
def child(args: list[str], ready: Callable[[subprocess.Popen[str]], None]) -> Iterator[None]:
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready(process)
        yield
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def wait_for_socket(path: Path) -> Callable[[subprocess.Popen[str]], None]:
    def ready(process: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"{process.args!r} exited with {process.returncode}")
            try:
                with npu_client.connect(str(path), name="bench-probe"):
                    return
            except npu_client.ConnectFailed:
                time.sleep(0.05)
        raise SystemExit(f"{path} never accepted a connection")

    return ready


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def echo_round_trips(path: Path, count: int) -> list[float]:
    data = bytes(range(64))
    prim = struct.pack("<II", 64, 64)
    with npu_client.connect(str(path), name="bench-echo") as npu, npu.open(ECHO_URI) as echo:
        for _ in range(min(200, count)):  # warm up both ends
            echo.invoke(2, [prim, data], [64])
        samples = []
        for _ in range(count):
            start = time.perf_counter_ns()
            out = echo.invoke(2, [prim, data], [64])
            samples.append((time.perf_counter_ns() - start) / 1000)
            assert out[0] == data
    return samples


def big_transfer(path: Path, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds per 16 MiB: by fd, and inline through the socket (both checksummed)."""
    payload = os.urandom(BIG)
    expected = zlib.crc32(payload)
    by_fd: list[float] = []
    inline: list[float] = []
    with npu_client.connect(str(path), name="bench-16m") as npu, npu.open(TEST_URI) as test:
        chunk = npu.limits.max_inline_bytes - 64
        with npu.alloc(BIG) as buf:
            buf.map()
            for _ in range(rounds):
                start = time.perf_counter()
                buf.view()[:] = payload  # the producer writes into shared memory
                out = test.invoke(3, [struct.pack("<I", BIG), buf.slice(0, BIG)], [4])
                (crc,) = struct.unpack("<I", _inline(out[0]))
                by_fd.append(time.perf_counter() - start)
                assert crc == expected
        for _ in range(rounds):
            start = time.perf_counter()
            crc = 0
            for offset in range(0, BIG, chunk):
                piece = payload[offset : offset + chunk]
                out = test.invoke(3, [struct.pack("<I", len(piece)), piece], [4])
                (part,) = struct.unpack("<I", _inline(out[0]))
                crc = zlib.crc32(piece, crc) if part == zlib.crc32(piece) else -1
            inline.append(time.perf_counter() - start)
            assert crc == expected
    return by_fd, inline


def _inline(output: bytes | None) -> bytes:
    if output is None:
        raise AssertionError("an inline output came back as a buffer slice")
    return output


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--round-trips", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5, help="16 MiB transfers per variant")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp:
        npud_sock, floor_sock = Path(tmp) / "npud.sock", Path(tmp) / "floor.sock"
        config = Path(tmp) / "npud.toml"
        config.write_text("[backend]\nkind = 'emulator'\n[daemon]\nlog_level = 'warning'\n")
        npud = [sys.executable, "-m", "npud.main", "--config", str(config),
                "--socket", str(npud_sock)]  # fmt: skip
        floor = [sys.executable, "-m", "bench.floor_server", str(floor_sock)]
        with child(npud, wait_for_socket(npud_sock)), child(floor, wait_for_socket(floor_sock)):
            floor_rt = echo_round_trips(floor_sock, args.round_trips)
            npud_rt = echo_round_trips(npud_sock, args.round_trips)
            by_fd, inline = big_transfer(npud_sock, args.rounds)

    figures = {
        "echo64_floor_p50_us": percentile(floor_rt, 0.50),
        "echo64_floor_p99_us": percentile(floor_rt, 0.99),
        "echo64_npud_p50_us": percentile(npud_rt, 0.50),
        "echo64_npud_p99_us": percentile(npud_rt, 0.99),
        "big16m_fd_median_ms": statistics.median(by_fd) * 1000,
        "big16m_inline_median_ms": statistics.median(inline) * 1000,
    }
    figures["ratio_echo64_p50_npud_over_floor"] = (
        figures["echo64_npud_p50_us"] / figures["echo64_floor_p50_us"]
    )
    figures["ratio_echo64_p99_npud_over_floor"] = (
        figures["echo64_npud_p99_us"] / figures["echo64_floor_p99_us"]
    )
    figures["ratio_big16m_inline_over_fd"] = (
        figures["big16m_inline_median_ms"] / figures["big16m_fd_median_ms"]
    )
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"64-byte echo round trip, blocking client, {args.round_trips} calls each")
    print(f"  floor (bare trio framing)  p50 {figures['echo64_floor_p50_us']:8.1f} us"
          f"   p99 {figures['echo64_floor_p99_us']:8.1f} us")  # fmt: skip
    print(f"  npud (emulator)            p50 {figures['echo64_npud_p50_us']:8.1f} us"
          f"   p99 {figures['echo64_npud_p99_us']:8.1f} us")  # fmt: skip
    print(f"  ratio npud/floor           p50 {figures['ratio_echo64_p50_npud_over_floor']:8.2f}x"
          f"   p99 {figures['ratio_echo64_p99_npud_over_floor']:8.2f}x")  # fmt: skip
    print(f"16 MiB to the DSP and checksummed, median of {args.rounds}")
    print(f"  by fd (DMA-BUF slice)      {figures['big16m_fd_median_ms']:8.1f} ms")
    print(f"  through the socket inline  {figures['big16m_inline_median_ms']:8.1f} ms")
    print(f"  ratio inline/fd            {figures['ratio_big16m_inline_over_fd']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

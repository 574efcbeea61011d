"""llama.cpp's op batch through npud vs the same batch with the least machinery (issue 28, item 5).

A batch of llama.cpp's Hexagon backend is two round trips: the doorbell (dspqueue
``signal``) and the answer (the ``wait`` invoke of ``wait_signal``). The subject is
the peer build's ``llama-simple`` decoding the tiny q4_0 llama through npud
(``background``, its own domain); the baseline is the same program, same library,
same emulator calls, through bench/batch_server.py: one blocking thread per
connection making the ``FastRpcSession`` calls npud makes, a thread per ``wait``,
nothing else. Both model the device's DSP (``dsp_units = 4``, ``hmx_units = 1``, as
``voice_day --llm``). A batch's time at the client is llama.cpp's eval time per
token (one batch a token): it includes llama.cpp's own CPU work between answer and
next doorbell and the emulated DSP process's thread hand-offs, on both sides, so
their difference is what npud adds. A call's round trip is a 64-byte echo, measured
the same way (npud and the floor server, same connection kind). Runs alternate
which side goes first, round by round.

Rows (median of the per-round values, IQR):

* ``batch_rtt.batch``: a batch's time at the client, npud / floor (no goal);
* ``batch_rtt.call``: a 64-byte echo's round trip, npud / floor (no goal);
* ``batch_rtt.added_per_batch``: (a batch through npud - the same batch through the
  floor) / one call's round trip through npud (goal <= 2: two round trips that
  cost two round trips);
* ``batch_rtt.added_beyond_dsp``: the same with each side's own DSP time per batch
  taken off first (no goal): the emulated DSP's time varies from run to run with
  the host's load, and it is the emulator's, not npud's.

Figures: the batch times, the DSP's own time per batch on each side (llama.cpp's
``OPBATCH`` profile), the echo round trips.

Needs the peer build (``make peer-llama``; its cache is ``$NPUD_PEER_CACHE``).
Run: ``python -m bench.batch_rtt [--rounds N] [--tokens N]``, or
``python -m bench --only batch_rtt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, NamedTuple

import npu_client
from bench import harness, processes
from bench.voice_llm import ECHO_URI, EMULATOR, PROMPT, Peer, find_peer

NAME: Final = "batch_rtt"
SUMMARY: Final = "llama.cpp's op batch: npud vs a minimal server making the same emulator calls"
GOAL: Final = 2.0
DSP_UNITS: Final = 4
HMX_UNITS: Final = 1
_PRIM: Final = struct.pack("<II", 64, 64)


class Decode(NamedTuple):
    batch_ms: float
    """llama.cpp's eval time per token: one op batch at the client."""
    dsp_ms: float
    """The median DSP time of the decode's batches (OPBATCH), the prompt's left out."""


def decode(peer: Peer, socket: Path, tokens: int) -> Decode:
    """One ``llama-simple`` run through the server at ``socket``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_", "NPUD_"))}
    env.update(
        LD_LIBRARY_PATH=str(peer.shim),
        NPUD_SOCKET=str(socket),
        NPUD_PRIORITY="background",
        NPUD_CLIENT_NAME="bench-batch-rtt",
        GGML_HEXAGON_MBUF="256",
        GGML_HEXAGON_PROFILE="1",
    )
    args = [str(peer.program), "-m", str(peer.model), "-n", str(tokens), PROMPT]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    log = result.stderr
    evaluated = re.search(r"eval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
    opbatch = [int(m) for m in re.findall(r"profile-op OPBATCH\|.*\|usec (\d+)", log)]
    if result.returncode != 0 or evaluated is None or len(opbatch) < 2:
        raise RuntimeError(
            f"llama-simple on {socket.name} exited {result.returncode}:\n{log[-2000:]}"
        )
    if "assigned to device HTP0" not in log:
        raise RuntimeError("llama-simple did not offload to the NPU (HTP0)")
    return Decode(
        float(evaluated.group(1)) / int(evaluated.group(2)),
        statistics.median(opbatch[1:]) / 1000,
    )


class Echo:
    """A 64-byte echo handle on one server; :meth:`rtt_ms` times a round of calls."""

    def __init__(self, socket: Path, stack: contextlib.ExitStack) -> None:
        self._client = stack.enter_context(npu_client.connect(str(socket), name="bench-echo"))
        self._echo = stack.enter_context(self._client.open(ECHO_URI))
        self.rtt_ms(100)  # warm up both ends

    def rtt_ms(self, calls: int) -> float:
        data = bytes(64)
        samples = []
        for _ in range(calls):
            began = time.perf_counter()
            self._echo.invoke(2, [_PRIM, data], [64])
            samples.append(time.perf_counter() - began)
        return statistics.median(samples) * 1000


def measure(
    workdir: Path, rounds: int, tokens: int, calls: int, progress: harness.Context | None = None
) -> list[harness.Row]:
    peer = find_peer()
    batches: dict[str, list[Decode]] = {"npud": [], "floor": []}
    rtts: dict[str, list[float]] = {"npud": [], "floor": []}
    with contextlib.ExitStack() as stack:
        sockets = {
            "npud": stack.enter_context(processes.npud(workdir, "npud-batch", EMULATOR)),
            "floor": stack.enter_context(processes.batch_server(workdir, DSP_UNITS, HMX_UNITS)),
        }
        echoes = {side: Echo(path, stack) for side, path in sockets.items()}
        for path in sockets.values():
            decode(peer, path, 8)  # warm up: files, caches, the first DSP process
        for index in range(rounds):
            if progress is not None:
                progress.progress(f"round {index + 1}/{rounds}")
            order = ("npud", "floor") if index % 2 == 0 else ("floor", "npud")
            for side in order:
                batches[side].append(decode(peer, sockets[side], tokens))
            for side in order:
                rtts[side].append(echoes[side].rtt_ms(calls))
    return _rows(batches, rtts)


def _rows(batches: dict[str, list[Decode]], rtts: dict[str, list[float]]) -> list[harness.Row]:
    npud, floor = batches["npud"], batches["floor"]
    added = [
        (n.batch_ms - f.batch_ms) / rtt for n, f, rtt in zip(npud, floor, rtts["npud"], strict=True)
    ]
    beyond = [
        ((n.batch_ms - n.dsp_ms) - (f.batch_ms - f.dsp_ms)) / rtt
        for n, f, rtt in zip(npud, floor, rtts["npud"], strict=True)
    ]
    figures = {
        "npud_batch_ms": statistics.median(d.batch_ms for d in npud),
        "floor_batch_ms": statistics.median(d.batch_ms for d in floor),
        "npud_batch_dsp_ms": statistics.median(d.dsp_ms for d in npud),
        "floor_batch_dsp_ms": statistics.median(d.dsp_ms for d in floor),
        "npud_added_ms": statistics.median(
            n.batch_ms - f.batch_ms for n, f in zip(npud, floor, strict=True)
        ),
        "npud_echo_ms": statistics.median(rtts["npud"]),
        "floor_echo_ms": statistics.median(rtts["floor"]),
    }
    row = harness.ratio_row
    return [
        row(
            "batch_rtt.batch",
            "a llama.cpp op batch at the client: npud / a minimal server (same calls)",
            [n.batch_ms / f.batch_ms for n, f in zip(npud, floor, strict=True)],
            figures,
        ),
        row(
            "batch_rtt.call",
            "a 64-byte echo's round trip: npud / the same minimal server",
            [n / f for n, f in zip(rtts["npud"], rtts["floor"], strict=True)],
            figures,
        ),
        row(
            "batch_rtt.added_per_batch",
            "time npud adds to a batch (npud - minimal server) / one call's round trip",
            added,
            figures,
            harness.Goal("ratio", GOAL),
        ),
        row(
            "batch_rtt.added_beyond_dsp",
            "the same, each side's own DSP time per batch taken off first",
            beyond,
            figures,
        ),
    ]


def rows(ctx: harness.Context) -> list[harness.Row]:
    return measure(ctx.workdir, ctx.rounds(9, 3), ctx.rounds(64, 32), ctx.rounds(300, 100), ctx)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batch_rtt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=9, help="rounds (default 9)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens a run (default 64)")
    parser.add_argument("--calls", type=int, default=300, help="echo calls a round (300)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tokens < 2 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1, --tokens at least 2")
    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp:
        result = measure(Path(tmp), args.rounds, args.tokens, args.calls)
    print(harness.format_table(result, quick=False))
    f = result[0].figures
    print(
        f"batch at the client: npud {f['npud_batch_ms']:.2f} ms, floor {f['floor_batch_ms']:.2f}"
        f" ms (DSP {f['npud_batch_dsp_ms']:.2f} / {f['floor_batch_dsp_ms']:.2f} ms);"
        f" npud adds {f['npud_added_ms']:.3f} ms; echo npud {f['npud_echo_ms']:.3f} ms,"
        f" floor {f['floor_echo_ms']:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

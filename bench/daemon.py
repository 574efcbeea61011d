"""The daemon's own size and start-up, beside a bare interpreter importing its dependencies.

Each round starts npud on the emulator (socket, shell verification, session,
listener: everything a real start does) and a bare
``python -c 'import trio, msgspec, structlog'`` that reports when its imports
are done, in alternating order. Rows:

* ``daemon.start``: process start to a Welcome for the first Hello, over
  process start to the bare interpreter's imports done. Goal <= 1.2.
* ``daemon.rss``: the idle daemon's resident size (after that Hello, the
  client gone, half a second idle) over the bare interpreter's.
  Goal: the daemon's own figure <= 40 MiB.
"""

from __future__ import annotations

import sys
import time

from bench.harness import Context, Goal, Row, interleave, median, ratio_row
from bench.processes import BARE_IMPORTS, npud_command, rss_bytes, running, wait_for_hello

NAME = "daemon"
SUMMARY = "idle RSS and start-to-Hello of npud vs a bare interpreter importing its dependencies"

IDLE_SECONDS = 0.5
MIB = 1024 * 1024
START_GOAL = 1.2
RSS_GOAL_MIB = 40.0
BARE_PROGRAM = f"{BARE_IMPORTS}; import sys; print('ready', flush=True); sys.stdin.read()"


def rows(ctx: Context) -> list[Row]:
    rounds = ctx.rounds(15, 3)  # a start varies by tens of ms on a shared machine
    daemon_rss: list[float] = []
    bare_rss: list[float] = []
    counter = iter(range(1_000_000))

    def daemon() -> float:
        socket_path = ctx.workdir / f"start-{next(counter)}.sock"
        start = time.monotonic()
        with running(npud_command(ctx.workdir, socket_path)) as process:
            serving = wait_for_hello(process, socket_path)
            time.sleep(IDLE_SECONDS)
            daemon_rss.append(rss_bytes(process.pid) / MIB)
        return serving - start

    def bare() -> float:
        start = time.monotonic()
        with running([sys.executable, "-c", BARE_PROGRAM]) as process:
            assert process.stdout is not None
            if process.stdout.readline() != b"ready\n":
                raise RuntimeError("the bare interpreter did not start")
            ready = time.monotonic()
            bare_rss.append(rss_bytes(process.pid) / MIB)
        return ready - start

    daemon_s, bare_s = interleave(rounds, daemon, bare)
    return [
        ratio_row(
            "daemon.start",
            "npud start to Welcome / bare import of trio, msgspec, structlog",
            [d / b for d, b in zip(daemon_s, bare_s, strict=True)],
            {"npud_ms": median(daemon_s) * 1000, "bare_import_ms": median(bare_s) * 1000},
            Goal("ratio", START_GOAL),
        ),
        ratio_row(
            "daemon.rss",
            "idle npud RSS / bare interpreter RSS",
            [d / b for d, b in zip(daemon_rss, bare_rss, strict=True)],
            {"npud_mib": median(daemon_rss), "bare_mib": median(bare_rss)},
            Goal("npud_mib", RSS_GOAL_MIB),
        ),
    ]

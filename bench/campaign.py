"""The fault campaign: npud under kills, hostile frames, slowloris and DSP outages.

One command (``make campaign``, or ``python -m bench.campaign [--quick]``; root,
for the slowloris user and the debug faults) starts npud on the emulator and,
while two well-behaved clients (realtime and normal, each in its own process)
echo every 2 ms:

1. measures each steady client alone first (its quiet p99 is its yardstick);
2. SIGKILLs ``--kills`` victims (1000), forked from a zygote that has
   npu_client imported, each holding buffers and a skel handle and keeping six
   2 ms calls going;
3. sends ``--frames`` hostile frames (100,000) over many connections: garbage,
   bad headers, lying lengths, unknown and misdirected types, duplicate keys,
   fds nobody asked for, half frames;
4. meanwhile holds 80 sockets of another user (uid 65534) that never say
   Hello (slowloris: 8 get handshake slots, the rest are refused at once) and,
   while they are held, lets a latecomer of another user in;
5. soaks for ``--soak`` seconds (300) with kills going on, sampling the
   daemon's RSS after every batch of eight;
6. takes the DSP away for one second, three times (``npuctl debug ssr``), and
   measures how long until a call on a newly opened handle succeeds again;
7. runs the same victim churn against the same-work floor
   (bench/same_work_server.py) and against a fresh npud, alternating, with a
   realtime steady client: what the machine and the in-process emulator do to
   the tail, apart from what npud adds.

It prints a report and writes it as JSON (``build/bench/campaign-<time>.json``):
tracebacks, warnings and errors in the daemon's log; fds by kind, clients,
buffers and handles against the start; each steady client's errors and p99
(overall and by phase) against its quiet p99; RSS growth over the soak; the
recovery times; the churn comparison. ``--limit`` (3600 s) bounds the whole run:
a wedged daemon ends it with an error, its children reaped. Goals (issue 9): 0 tracebacks, 0 leaks,
0 errors for the well-behaved client and its p99 within 3x of quiet, RSS growth
under 2 MiB over the soak, recovery within 1.3 s of a 1 s outage. It asserts
nothing: it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import npu_client
import npu_protocol as p
from bench.harness import timestamp
from bench.processes import CHILD_ENVIRONMENT, npud_process, rss_bytes, same_work_server
from npu_client.transport import fds_ancillary

TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"

VICTIM_CALL_US = 2000
"""Each victim thread's busy call: short, as a real client's, so some are always in flight."""

ZYGOTE = f"""
import ctypes, os, signal, struct, sys, threading
import npu_client
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the victims

def victim():
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the zygote
    npu = npu_client.connect(name="victim", timeout=30)
    skel = npu.open({TEST_URI!r})
    buffers = [npu.alloc(65536) for _ in range(ALLOCATIONS)]
    def calls():
        while True:
            skel.invoke(4, [struct.pack("<I", {VICTIM_CALL_US})])
    for _ in range(6):
        threading.Thread(target=calls, daemon=True).start()
    os.write(1, f"{{os.getpid()}}\\n".encode())
    threading.Event().wait()

ALLOCATIONS = int(sys.argv[1])
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            victim()
        except BaseException:
            os.write(1, b"failed\\n")
        os._exit(0)
"""
"""Forks victims that already have npu_client imported: a victim costs a fork, not an
interpreter start, so the campaign's own CPU use does not swamp the steady client."""


RECOVERING = (npu_client.DspRestarted, npu_client.Unsupported, npu_client.OpenFailed)
"""What an open may fail with while the DSP comes back."""


class Steady:
    """The well-behaved client: echoes in a loop, counting errors, keeping latencies."""

    def __init__(self, path: Path, priority: str) -> None:
        self.priority = priority
        self._client = npu_client.connect(
            str(path), name=f"steady-{priority}", priority=priority, timeout=30
        )
        self._echo = self._client.open(ECHO_URI)
        self._prim = struct.pack("<II", 64, 64)
        self.latencies: list[float] = []
        self.phases: dict[str, list[float]] = {}
        self.phase = "start"
        self.errors: list[str] = []
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def measure(self, seconds: float) -> list[float]:
        """Call for ``seconds`` in this thread; the latencies."""
        out: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(self._once())
            time.sleep(0.002)
        return out

    def _once(self) -> float:
        """One echo; its latency. A restart's reopening is not part of it: during an
        outage the client is told at once and waits for the DSP, which is not latency."""
        started = time.perf_counter()
        try:
            self._echo.invoke(2, [self._prim, bytes(64)], [64])
        except npu_client.DspRestarted:
            elapsed = time.perf_counter() - started
            self.restarts += 1
            self._reopen()  # a restart is announced, not an error of this client's
            return elapsed
        except npu_client.NpuError as exc:
            self.errors.append(f"{exc.name}: {exc}")
        return time.perf_counter() - started

    def report(self, quiet: list[float]) -> dict[str, Any]:
        """The figures of the steady client's run, against its quiet latencies."""
        p99_ms = p99(self.latencies) * 1000
        quiet_p99_ms = p99(quiet) * 1000
        return {
            "quiet_p99_ms": quiet_p99_ms,
            "calls": len(self.latencies),
            "error_count": len(self.errors),
            "errors": self.errors[:20],
            "told_restarted": self.restarts,
            "p99_ms": p99_ms,
            "p99_ms_by_phase": {
                phase: round(p99(values) * 1000, 3) for phase, values in self.phases.items()
            },
            "p99_over_quiet": p99_ms / max(quiet_p99_ms, 1e-9),
        }

    def _reopen(self) -> None:
        deadline = time.monotonic() + RECOVERY_LIMIT
        while time.monotonic() < deadline:
            try:
                self._echo = self._client.open(ECHO_URI)
                return
            except RECOVERING:
                time.sleep(0.01)
        self.errors.append(f"the DSP did not come back within {RECOVERY_LIMIT:g} s")

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                latency = self._once()
                self.latencies.append(latency)
                self.phases.setdefault(self.phase, []).append(latency)
                time.sleep(0.002)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._echo.close()
        self._client.close()


def steady_child(path: Path, priority: str, quiet_seconds: float) -> int:
    """The steady client as its own process (``--steady``): measures itself alone,
    says ``ready``, calls through the phases named on stdin, and at stdin's end
    prints its report as JSON. Its own interpreter: the campaign's busy loops
    (hostile frames) would otherwise hold the GIL its latencies are measured under."""
    steady = Steady(path, priority)
    quiet = steady.measure(quiet_seconds)
    print("ready", flush=True)
    steady.phase = sys.stdin.readline().strip()
    steady.start()
    for line in sys.stdin:
        steady.phase = line.strip()
    steady.stop()
    print(json.dumps(steady.report(quiet)), flush=True)
    return 0


class SteadyProcess:
    """A steady client in a child process; see :func:`steady_child`."""

    def __init__(self, path: Path, priority: str, quiet_seconds: float) -> None:
        self.priority = priority
        self._child = subprocess.Popen(
            [
                sys.executable, "-m", "bench.campaign", "--steady", priority,
                "--socket", str(path), "--quiet-seconds", str(quiet_seconds),
            ],
            env=CHILD_ENVIRONMENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self._child.stdout is not None
        if self._child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {priority} steady client did not start")

    def phase(self, name: str) -> None:
        assert self._child.stdin is not None
        self._child.stdin.write(name + "\n")
        self._child.stdin.flush()

    def close(self) -> None:
        """Kill and reap the child if it is still there (after finish(), or on an error)."""
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        for pipe in (self._child.stdin, self._child.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def finish(self) -> dict[str, Any]:
        assert self._child.stdin is not None
        assert self._child.stdout is not None
        self._child.stdin.close()
        report: dict[str, Any] = json.loads(self._child.stdout.readline())
        self._child.wait(60)
        self._child.stdout.close()
        return report


def churn_against_the_floor(
    workdir: Path, config: str, seconds: float, rounds: int
) -> dict[str, Any]:
    """The same victim churn against npud and against the same-work floor
    (bench/same_work_server.py: the same protocol objects and emulator calls, one
    thread per connection, nothing else), alternating: a realtime steady client's
    p99 under churn for each. The floor cannot allocate, so these victims hold no
    buffers. What npud adds to the tail is the ratio; what the machine and the
    in-process emulator add is the floor's own growth over its quiet p99."""
    loaded: dict[str, list[float]] = {"npud": [], "floor": []}
    quiet: dict[str, list[float]] = {"npud": [], "floor": []}
    for index in range(rounds * 2):
        kind = ("floor", "npud")[(index + index // 2) % 2]  # floor, npud, npud, floor...
        with contextlib.ExitStack() as stack:
            if kind == "npud":
                path, _ = stack.enter_context(npud_process(workdir, f"churn{index}", config))
            else:
                path, _ = stack.enter_context(same_work_server(workdir))
            steady = SteadyProcess(path, "realtime", 3.0)
            stack.callback(steady.close)
            steady.phase("churn")
            victims = Victims(path, allocations=0)
            stack.callback(victims.close)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                victims.kill(16)
            victims.close()
            figures = steady.finish()
        loaded[kind].append(figures["p99_ms"])
        quiet[kind].append(figures["quiet_p99_ms"])
    return {
        "seconds_per_round": seconds,
        "npud_p99_ms": loaded["npud"],
        "floor_p99_ms": loaded["floor"],
        "npud_quiet_p99_ms": quiet["npud"],
        "floor_quiet_p99_ms": quiet["floor"],
        "npud_over_floor_p99": statistics.median(loaded["npud"])
        / statistics.median(loaded["floor"]),
    }


def set_phase(steadies: list[SteadyProcess], phase: str) -> None:
    for steady in steadies:
        steady.phase(phase)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


class Victims:
    """The zygote that forks victims; each victim holds buffers and a skel handle and
    keeps six calls going until it is SIGKILLed."""

    def __init__(self, path: Path, allocations: int = 4) -> None:
        self._zygote = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(allocations)],
            env={**CHILD_ENVIRONMENT, "NPUD_SOCKET": str(path)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def kill(self, count: int, parallel: int = 16) -> tuple[int, int]:
        """``count`` victims, SIGKILLed at random moments once ready; how many were
        killed, and how many never got ready (refused, or crashed: counted, not hidden)."""
        assert self._zygote.stdin is not None
        assert self._zygote.stdout is not None
        killed = unready = 0
        while killed + unready < count:
            batch = min(parallel, count - killed - unready)
            self._zygote.stdin.write("spawn\n" * batch)
            self._zygote.stdin.flush()
            for _ in range(batch):
                answer = self._zygote.stdout.readline().strip()
                if not answer.isdigit():
                    unready += 1
                    continue
                time.sleep(random.uniform(0, 0.05))
                os.kill(int(answer), signal.SIGKILL)
                killed += 1
        return killed, unready

    def close(self) -> None:
        """End the zygote; victims it forked and nobody killed die with it (PDEATHSIG)."""
        if self._zygote.stdin is not None:
            with contextlib.suppress(OSError):
                self._zygote.stdin.close()
        try:
            self._zygote.wait(30)
        except subprocess.TimeoutExpired:
            self._zygote.kill()
            self._zygote.wait()
        if self._zygote.stdout is not None:
            self._zygote.stdout.close()


def _frame(payload: bytes, fd_count: int = 0) -> bytes:
    return b"NP" + bytes([fd_count, 0]) + struct.pack("<I", len(payload)) + payload


def hostile_frames(path: Path, count: int) -> int:
    """``count`` bad frames over many connections; how many were sent."""
    hello = p.ClientConnection().send(
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="hostile")
    )[0]
    kinds = [
        lambda: _frame(os.urandom(random.randint(1, 200))),
        lambda: b"XX" + os.urandom(6),
        lambda: _frame(b"\x81\xa4type\xa9format_me"),
        lambda: _frame(b"\x82\xa4type\xa4ping\xa2id\xcb" + os.urandom(8)),
        lambda: b"NP\x09\x00" + struct.pack("<I", 10),
        lambda: b"NP\x00\x00" + struct.pack("<I", 1 << 30),
        lambda: _frame(b"\x83\xa4type\xa4ping\xa2id\x01\xa2id\x02"),
        lambda: _frame(b"\x82\xa4type\xa7welcome\xa5epoch\x01"),
    ]
    sent = 0
    refused_in_a_row = 0
    while sent < count:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            try:
                sock.connect(str(path))
            except OSError:
                refused_in_a_row += 1
                if refused_in_a_row > 50:
                    raise RuntimeError("npud stopped accepting connections") from None
                time.sleep(0.01)
                continue
            refused_in_a_row = 0
            sock.sendall(hello)
            for _ in range(random.randint(1, 60)):
                if random.random() < 0.1:  # fds nobody asked for
                    read_end, write_end = os.pipe()
                    try:
                        sock.sendmsg([b"\x00"], fds_ancillary([read_end, write_end]))
                    finally:
                        os.close(read_end)
                        os.close(write_end)
                sock.sendall(random.choice(kinds)())
                sent += 1
        except OSError:
            pass  # the daemon closed it after a violation: as it should
        finally:
            sock.close()
    return sent


SLOWLORIS_UID = 65534
"""The attacker's uid (nobody): the per-uid handshake slots keep it from other users."""


def _hold_sockets(path: Path, sockets: int, ready: int, stop: int) -> None:
    """In the forked attacker: become nobody, connect, report how many, wait for stop."""
    os.setgroups([])
    os.setgid(SLOWLORIS_UID)
    os.setuid(SLOWLORIS_UID)
    held = []
    for _ in range(sockets):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            held.append(sock)
        except OSError:
            sock.close()
    os.write(ready, f"{len(held)}\n".encode())
    os.read(stop, 1)


@contextmanager
def slowloris(path: Path, sockets: int) -> Iterator[int]:
    """``sockets`` connections from another user (a forked child that drops to
    nobody: no interpreter of ours need be readable by it) that never say Hello;
    yields how many connected. Held until the block ends."""
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(ready_read)
            os.close(stop_write)
            _hold_sockets(path, sockets, ready_write, stop_read)
            status = 0
        finally:
            os._exit(status)
    os.close(ready_write)
    os.close(stop_read)
    try:
        with os.fdopen(ready_read) as ready:
            yield int(ready.readline() or 0)
    finally:
        os.close(stop_write)
        os.waitpid(pid, 0)


RECOVERY_LIMIT = 60.0
"""Seconds a restarted DSP gets to come back before the campaign calls it a failure."""


def outage_recovery(path: Path, down: float) -> float:
    """Take the DSP away for ``down`` s; seconds from then until an echo on a newly
    opened handle succeeds again (the operator's connection stays open throughout)."""
    with npu_client.connect(str(path), name="operator", timeout=30) as npu:
        started = time.monotonic()
        npu.debug_fault("ssr", down)
        prim = struct.pack("<II", 8, 8)
        while time.monotonic() - started < RECOVERY_LIMIT:
            try:
                with npu.open(ECHO_URI) as echo:
                    echo.invoke(2, [prim, bytes(8)], [8])
                return time.monotonic() - started
            except RECOVERING:
                time.sleep(0.005)
    raise RuntimeError(f"the DSP did not come back within {RECOVERY_LIMIT:g} s")


def fd_kinds(pid: int) -> dict[str, int]:
    """The daemon's fds by kind (socket, pipe, anon_inode:[eventfd], /memfd:...)."""
    kinds: Counter[str] = Counter()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed while listed
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            kinds["log file" if target.endswith(".log") else target.split("[")[0].rstrip(":")] += 1
    return dict(kinds)


def snapshot(path: Path, pid: int) -> dict[str, Any]:
    with npu_client.connect(str(path), name="observer", timeout=30) as npu:
        status = npu.status()
    session = status.session
    return {
        "fds": fd_kinds(pid),
        "clients": len(status.clients),
        "buffers": status.totals.buffers,
        "handles": status.totals.handles,
        "session_buffers": session.buffers if session else -1,
        "session_handles": session.remote_handles if session else -1,
    }


def settle(path: Path, pid: int, baseline: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        now = snapshot(path, pid)
        if now == baseline or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def read_log(path: Path) -> dict[str, Any]:
    """Counts from the daemon's JSON log: tracebacks, lines per level, the commonest warnings."""
    levels: Counter[str] = Counter()
    notable: Counter[str] = Counter()
    tracebacks = 0
    unparsed = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            unparsed += 1
            tracebacks += line.startswith("Traceback")
            continue
        level = str(record.get("level", "?"))
        levels[level] += 1
        tracebacks += "exception" in record or "Traceback" in line
        if level in ("warning", "error", "critical"):
            notable[f"{level}: {record.get('event', '?')}"] += 1
    return {
        "tracebacks": tracebacks,
        "levels": dict(levels),
        "unparsed_lines": unparsed,
        "top_warnings_and_errors": dict(notable.most_common(10)),
    }


def soak(victims: Victims, pid: int, seconds: float) -> dict[str, Any]:
    """Kill victims eight at a time for ``seconds``, sampling the daemon's RSS after each
    batch; the figures."""
    rss = [rss_bytes(pid)]
    end = time.monotonic() + seconds
    killed = 0
    while time.monotonic() < end:
        killed += victims.kill(8, parallel=8)[0]
        rss.append(rss_bytes(pid))
    return {
        "soak_killed": killed,
        "rss_growth_mib": (rss[-1] - rss[0]) / (1 << 20),
        "rss_max_mib": max(rss) / (1 << 20),
        "rss_mib": rss[-1] / (1 << 20),
        "rss_samples": len(rss),
    }


def _out_of_time(signum: int, frame: object) -> None:
    raise TimeoutError("the campaign ran past --limit: is npud wedged?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.campaign", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of everything")
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--soak", type=float, default=300.0, help="seconds of soak")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--limit", type=float, default=3600.0, help="seconds before the campaign gives up"
    )
    parser.add_argument("--steady", help=argparse.SUPPRESS)  # the child of SteadyProcess
    parser.add_argument("--socket", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quiet-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steady:
        return steady_child(args.socket, args.steady, args.quiet_seconds)
    if args.quick:
        args.kills, args.frames, args.soak = args.kills // 10, args.frames // 10, args.soak / 10
    if os.geteuid() != 0:
        parser.error("needs root: the slowloris user (uid 65534) and npuctl debug faults")
    # An overall limit, so that a wedged daemon ends the campaign (children reaped by
    # the context managers on the way out) instead of hanging it.
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(int(args.limit))
    with tempfile.TemporaryDirectory(prefix="npud-campaign-") as scratch:
        os.chmod(scratch, 0o711)  # noqa: S103 -- search only: the slowloris user reaches the socket
        return campaign(args, Path(scratch))


def campaign(args: argparse.Namespace, workdir: Path) -> int:
    log_path = workdir / "campaign.log"
    report: dict[str, Any] = {"kills": args.kills, "frames": args.frames, "soak_s": args.soak}
    # Appended to [daemon]. One uid runs the steady client, 16 victims at a time and
    # the probes; the victims' connections outlive their SIGKILL by their calls.
    config = (
        "socket_mode = '0666'\n"
        f"[access]\nallow_uids = [{SLOWLORIS_UID}]\n"
        "[uid_limits]\nmax_clients = 64\n"
    )
    with contextlib.ExitStack() as stack:
        path, pid = stack.enter_context(npud_process(workdir, "campaign", config, log=log_path))
        baseline = snapshot(path, pid)  # only the observer: what must be left at the end
        # A voice client (realtime: the reserved DSP slot) and an ordinary one, each
        # measured alone first. The ordinary one waits for a slot behind the
        # victims' calls, as it would behind any busy neighbour.
        quiet_seconds = 5.0 if args.quick else 10.0
        steadies = []
        for kind in ("realtime", "normal"):
            steadies.append(SteadyProcess(path, kind, quiet_seconds))
            stack.callback(steadies[-1].close)
        set_phase(steadies, "kills")
        print(f"killing {args.kills} clients", file=sys.stderr)
        victims = Victims(path)
        stack.callback(victims.close)
        report["killed"], report["victims_unready"] = victims.kill(args.kills)
        print(f"80 silent sockets, then {args.frames} hostile frames", file=sys.stderr)
        set_phase(steadies, "hostile")
        with slowloris(path, 80) as report["slowloris_connected"]:
            # Another user gets in while they are held (within hello_timeout_s).
            started = time.monotonic()
            with npu_client.connect(str(path), name="latecomer", timeout=30) as npu:
                npu.ping()
            report["latecomer_s"] = time.monotonic() - started
            report["hostile_frames"] = hostile_frames(path, args.frames)
        print(f"soaking {args.soak:g} s with kills", file=sys.stderr)
        set_phase(steadies, "soak")
        report.update(soak(victims, pid, args.soak))
        victims.close()
        set_phase(steadies, "outages")
        report["recovery_s"] = [outage_recovery(path, 1.0) for _ in range(3)]
        for steady in steadies:
            report[f"steady_{steady.priority}"] = steady.finish()
        after = settle(path, pid, baseline)
        report["before"] = baseline
        report["after"] = after
    report["log"] = read_log(log_path)
    print("the same churn against the same-work floor", file=sys.stderr)
    report["churn_vs_floor"] = churn_against_the_floor(
        workdir, config, 5.0 if args.quick else 15.0, 1 if args.quick else 3
    )
    out = args.json or Path("build/bench") / f"campaign-{timestamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for key, value in report.items():
        print(f"{key:24} {value}")
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

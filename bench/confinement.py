"""Faults stay in their domain: a realtime VAD client beside a domain that keeps failing.

A voice client runs the Silero VAD model through npud every 32 ms, realtime, in domain
``voice``. Meanwhile, in another domain, ``rough``, five kinds of fault happen, 20 times
each, taking turns:

* ``killed_pd``: the domain's DSP process is killed (``debug ssr`` of the domain);
* ``hung_call``: a call that would run for seconds, ended by the call watchdog (0.3 s
  here), which ends the domain's DSP process;
* ``endless_model``: a model whose one run would take far longer than the watchdog (32
  chained 1024x1024 matrix products, burning a core of the emulated DSP), ended the
  same way;
* ``loop_model``: an ONNX ``Loop`` model, refused at load (npud loads none);
* ``skel_crash``: a skel faults mid-call (``npu_test.fault``) and its process dies.

After each fault the bench waits for the domain to be back up. The VAD client counts its
errors, its deadline misses (a run answered after 30 ms) and its latencies, and the same
client's quiet time (no faults) right before is the baseline. Then the very same runs
again with the faulting clients placed in the voice domain itself: the difference
confinement makes.

Rows: ``confinement.vad_p99`` (p99 during the faults / quiet p99, confined; goal at most
1.5, issue 17), ``confinement.vad_errors`` and ``confinement.vad_misses`` (counts during
the faults, confined; goal 0 each), ``confinement.shared_errors`` (errors when the faults
hit the voice domain, the figures holding its misses and p99 ratio: no goal, the
contrast). Faults need root (``debug ssr``): run the bench as root.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import npu_client
from bench.harness import Context, Goal, Row, ratio_row
from bench.processes import npud_process, ready_child
from npu_protocol import DomainRow

NAME = "confinement"
SUMMARY = "a realtime VAD client while another domain crashes, hangs and loops (vs shared)"

TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
SC_BUSY: Final = 0x04010000
SC_FAULT: Final = 0x05000000
PERIOD_S: Final = 0.032
DEADLINE_S: Final = 0.030
WATCHDOG_S: Final = 0.3
KINDS: Final = ("killed_pd", "hung_call", "endless_model", "loop_model", "skel_crash")

BASE_CONFIG: Final = (  # its first keys land in the [daemon] table npud_command opens
    f"call_watchdog_s = {WATCHDOG_S}\nhung_call_throttle_s = 0\n"
    "hung_calls_before_revoke = 0\n"
    "[client_limits]\nmax_model_bytes = 268435456\n"
)
CONFINED: Final = (
    BASE_CONFIG + "[[domains.rule]]\nname = 'voice'\nclients = ['vad']\n"
    "[[domains.rule]]\nname = 'rough'\nclients = ['rough*']\n"
)
SHARED: Final = BASE_CONFIG + "[[domains.rule]]\nname = 'voice'\nclients = ['vad', 'rough*']\n"

VAD = """
import json, sys, time
import numpy as np
import npu_client
from npu_protocol import DomainRow
from bench.model_vad import SILERO, SHAPES
path, period, deadline = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
npu = npu_client.connect(path, name="vad", priority="realtime", budget=(period, 0.008))

def loaded():
    vad = npu.load_model(SILERO, shapes=SHAPES)
    vad.set_input("sr", np.array(16000, np.int64))
    vad.set_input("state", np.zeros((2, 1, 128), np.float32))
    return vad

vad = loaded()
chunk = np.random.default_rng(7).uniform(-0.5, 0.5, (1, 576)).astype(np.float32)
for _ in range(50):
    vad.set_input("input", chunk)
    vad.execute()
print("READY", flush=True)
runs = []  # (start, seconds, ok)
import select
tick = time.monotonic()
while not select.select([sys.stdin], [], [], 0)[0]:
    began = time.monotonic()
    try:
        vad.set_input("input", chunk)
        vad.execute()
        runs.append((began, time.monotonic() - began, True))
    except npu_client.NpuError:
        runs.append((began, time.monotonic() - began, False))
        try:
            vad = loaded()
        except npu_client.NpuError:
            pass
    tick += period
    time.sleep(max(0.0, tick - time.monotonic()))
print(json.dumps(runs), flush=True)
"""


def _endless_model(path: Path) -> None:
    """32 chained products of a 1024x1024 input with one 1024x1024 weight: seconds of
    compute per run, 4 MiB of weights."""
    import numpy as np  # noqa: PLC0415 - the daemon's benches need no numpy
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    side = 1024
    weight = numpy_helper.from_array(np.eye(side, dtype=np.float32), name="w")
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}"])
        for i in range(32)
    ]
    nodes.append(helper.make_node("Identity", ["h32"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [side, side])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, path)


def _loop_model(path: Path) -> None:
    from tests.emulator.onnx_models import endless_loop  # noqa: PLC0415

    path.write_bytes(endless_loop())


# The faults that end the domain's DSP process (the Loop model is refused at load).
RESTARTING_FAULTS = frozenset({"killed_pd", "hung_call", "endless_model", "skel_crash"})


class _Faults:
    """Each kind of fault, in the domain the ``rough*`` clients join."""

    def __init__(self, socket_path: Path, admin: npu_client.Client, workdir: Path) -> None:
        self._socket = str(socket_path)
        self._admin = admin
        self._endless = workdir / "endless.onnx"
        self._loop = workdir / "loop.onnx"
        _endless_model(self._endless)
        _loop_model(self._loop)
        self.unexpected: list[str] = []

    def domain(self) -> str:
        with npu_client.connect(self._socket, name="rough-probe") as probe:
            return probe.domain

    def run(self, kind: str, domain: str) -> None:
        fault: Callable[[str], None] = getattr(self, f"_{kind}")
        epoch = self._row(domain).epoch
        fault(domain)
        # A crash is noticed after the call that caused it has answered: wait for the
        # restart itself, or the next fault's open would meet it.
        self._back_up(domain, after_epoch=epoch if kind in RESTARTING_FAULTS else 0)

    def _row(self, domain: str) -> DomainRow:
        rows = {row.name: row for row in self._admin.status().domains}
        if domain not in rows:
            raise AssertionError(f"domain {domain} is not in the status")
        return rows[domain]

    def _back_up(self, domain: str, after_epoch: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = self._row(domain)
            if row.state == "up" and row.epoch > after_epoch:
                return
            time.sleep(0.01)
        raise AssertionError(f"domain {domain} did not come back up")

    def _expect(self, kind: str, call: Callable[[], object], *errors: type[Exception]) -> None:
        try:
            call()
        except errors:
            return
        except npu_client.NpuError as exc:
            self.unexpected.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        self.unexpected.append(f"{kind}: no error")

    def _killed_pd(self, domain: str) -> None:
        with npu_client.connect(self._socket, name="rough-kill") as holder:
            holder.alloc(4096)
            self._admin.debug_fault("ssr", domain=domain)

    def _hung_call(self, domain: str) -> None:
        with npu_client.connect(self._socket, name="rough-hang") as client:
            skel = client.open(TEST_URI)
            self._expect(
                "hung_call",
                lambda: skel.invoke(4, [struct.pack("<I", 10_000_000)]),
                npu_client.DspRestarted,
            )

    def _endless_model(self, domain: str) -> None:
        with npu_client.connect(self._socket, name="rough-model") as client:
            model = client.load_model(self._endless)
            model.input_view("x")[...] = 1.0
            self._expect("endless_model", model.execute, npu_client.DspRestarted)

    def _loop_model(self, domain: str) -> None:
        with npu_client.connect(self._socket, name="rough-loop") as client:
            self._expect(
                "loop_model", lambda: client.load_model(self._loop), npu_client.ModelRejected
            )

    def _skel_crash(self, domain: str) -> None:
        with npu_client.connect(self._socket, name="rough-crash") as client:
            skel = client.open(TEST_URI)
            self._expect("skel_crash", lambda: skel.invoke(5, []), npu_client.NpuError)


@contextmanager
def _vad(socket_path: Path) -> Iterator[subprocess.Popen[str]]:
    args = [sys.executable, "-c", VAD, str(socket_path), str(PERIOD_S), str(DEADLINE_S)]
    with ready_child(args, "the VAD client", cwd=Path(__file__).resolve().parent.parent) as process:
        yield process


Runs = list[tuple[float, float, bool]]


def _p99(runs: Runs) -> float:
    latencies = sorted(seconds for _, seconds, ok in runs if ok)
    return latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def _one(ctx: Context, config: str, name: str, rounds: int, quiet: float) -> dict[str, float]:
    """One daemon: the VAD client's quiet runs, then its runs while ``rounds`` of every
    fault happen in the ``rough*`` clients' domain."""
    with (
        npud_process(ctx.workdir, name=name, extra_config=config) as (socket_path, _),
        npu_client.connect(str(socket_path), name="bench-admin") as admin,
        _vad(socket_path) as vad,
    ):
        faults = _Faults(socket_path, admin, ctx.workdir)
        domain = faults.domain()
        start = time.monotonic()
        time.sleep(quiet)
        middle = time.monotonic()
        counts = dict.fromkeys(KINDS, 0)
        for index in range(rounds):
            ctx.progress(f"{name}: fault round {index + 1}/{rounds} in domain {domain}")
            for kind in KINDS:
                faults.run(kind, domain)
                counts[kind] += 1
        end = time.monotonic()
        assert vad.stdin is not None
        assert vad.stdout is not None
        vad.stdin.write("\n")
        vad.stdin.flush()
        runs: Runs = [tuple(run) for run in json.loads(vad.stdout.readline())]
    if faults.unexpected:
        raise AssertionError(f"faults that did not go as planned: {faults.unexpected}")
    calm = [run for run in runs if start <= run[0] < middle]
    stormy = [run for run in runs if middle <= run[0] < end]
    return {
        "quiet_p99_ms": _p99(calm) * 1000,
        "faults_p99_ms": _p99(stormy) * 1000,
        "errors": float(sum(not ok for _, _, ok in stormy)),
        "misses": float(sum(ok and seconds > DEADLINE_S for _, seconds, ok in stormy)),
        "runs": float(len(stormy)),
        "faults": float(sum(counts.values())),
        "seconds": end - middle,
    }


def rows(ctx: Context) -> list[Row]:
    if os.geteuid() != 0:
        raise RuntimeError("the confinement bench injects debug faults: run it as root")
    rounds = ctx.rounds(20, 3)
    quiet = ctx.rounds(10, 3)
    confined = _one(ctx, CONFINED, "confined", rounds, quiet)
    shared = _one(ctx, SHARED, "shared", rounds, quiet)
    storm = {key: confined[key] for key in ("faults", "runs", "seconds")}
    return [
        ratio_row(
            "confinement.vad_p99",
            "VAD p99 while another domain faults / its quiet p99, in the same run",
            [confined["faults_p99_ms"] / confined["quiet_p99_ms"]],
            {
                "quiet_p99_ms": confined["quiet_p99_ms"],
                "faults_p99_ms": confined["faults_p99_ms"],
                **storm,
            },
            Goal("ratio", 1.5, "at_most"),
        ),
        ratio_row(
            "confinement.vad_errors",
            "VAD runs that failed while another domain faulted (a count)",
            [confined["errors"]],
            storm,
            Goal("ratio", 0, "at_most"),
        ),
        ratio_row(
            "confinement.vad_misses",
            f"VAD runs answered after {DEADLINE_S * 1000:g} ms while another domain faulted"
            " (a count)",
            [confined["misses"]],
            storm,
            Goal("ratio", 0, "at_most"),
        ),
        ratio_row(
            "confinement.shared_errors",
            "the same faults in the VAD's own domain: its failed runs (a count; the contrast)",
            [shared["errors"]],
            {
                "misses": shared["misses"],
                "p99_ratio": shared["faults_p99_ms"] / shared["quiet_p99_ms"],
                "quiet_p99_ms": shared["quiet_p99_ms"],
                "faults_p99_ms": shared["faults_p99_ms"],
                "faults": shared["faults"],
                "runs": shared["runs"],
            },
        ),
    ]

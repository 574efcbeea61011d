"""The parse and batch attacks of issue 27's benchmark (``bench/attacks.py`` runs them).

* :func:`tiny_fields_model`: the review's crafted ONNX file, a ModelProto whose graph is
  2-byte empty nodes; ``bench/attacks.py``'s ``crafted_onnx_*`` scenarios have the
  attacker load it through npud beside the VAD victim.
* :func:`zero_stride`: the emulator itself (``EmulatedDriver``, DSP processes in child
  processes, as npud's domains run them; no daemon: npud's clients have no dspqueue
  API of their own); the victim an htp session in one DSP process running a SCALE batch
  every 32 ms, the attacker an htp session in another sending one CPY batch of 2^29 f32
  elements of stride 0 over 4 bytes. The attacker's DSP process's peak RSS, whether it
  lived, the batch's status, and the victim's errors and worst latency; "npud" here is
  this process (the driver's side), its RSS and fds sampled before and during the batch.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from npud.formats import onnx_proto  # npud's own encoder

PERIOD_S: Final = 0.032
SAMPLE_S: Final = 0.01
MIB: Final = 1 << 20


@dataclasses.dataclass
class Outcome:
    """What one attack did to its victim and to npud."""

    scenario: str
    victim_runs: int = 0
    victim_errors: int = 0
    victim_worst_ms: float = 0.0
    peak_rss_mib: float = 0.0
    rss_before_mib: float = 0.0
    peak_fds: int = 0
    fds_before: int = 0
    load_s: float = 0.0
    answer: str = ""
    details: dict[str, float] = dataclasses.field(default_factory=dict)


def tiny_fields_model(size: int) -> bytes:
    """About ``size`` bytes of ONNX ModelProto whose graph is 2-byte empty nodes."""
    head = b"\x08\x08" + onnx_proto.length_field(8, b"\x10\x11")
    return head + onnx_proto.length_field(7, b"\x0a\x00" * ((size - len(head) - 6) // 2))


class _Sampler:
    """A process's VmRSS and open fds, sampled on a thread of its own until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0
        self.peak_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def rss(self) -> int:
        return _status_kib(self.pid, "VmRSS") * 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self.peak_rss = max(self.peak_rss, self.rss())
                self.peak_fds = max(self.peak_fds, self.fds())
            except (OSError, ValueError):
                return  # the process is gone

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no {key}")


class _Victim:
    """``step`` every PERIOD_S on a thread of its own: its errors and worst latency."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._step = step
        self.runs = 0
        self.errors = 0
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="victim", daemon=True)

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._step()
            except Exception:
                self.errors += 1
            self.worst = max(self.worst, time.monotonic() - began)
            self.runs += 1
            tick += PERIOD_S
            time.sleep(max(0.0, tick - time.monotonic()))

    def __enter__(self) -> _Victim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def zero_stride(  # noqa: PLR0915 - one scenario, step by step
    elements: int = 1 << 29, settle_s: float = 1.0
) -> Outcome:
    """The review's htp batch: a CPY of ``elements`` f32 elements of stride 0 over 4
    bytes, in one DSP process, beside a victim htp session in another."""
    import numpy as np  # noqa: PLC0415

    from npud.fastrpc.host.dspqueue_cpu import CpuQueues  # noqa: PLC0415
    from npud.fastrpc.host.htp_host import F32, Arena, HtpHost, OpSpec, f32_bits  # noqa: PLC0415
    from npud.fastrpc.session import FastRpcSession  # noqa: PLC0415
    from npud.ops.backend import DEV_SHELL  # noqa: PLC0415
    from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig  # noqa: PLC0415

    outcome = Outcome(f"zero_stride_{elements}")
    driver = EmulatedDriver(SimConfig())
    sessions = [FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,)) for _ in range(2)]
    try:
        for session in sessions:
            session.load_shell(DEV_SHELL.read_bytes())
        hosts = [HtpHost(session, CpuQueues(session)) for session in sessions]
        for host in hosts:
            if host.start() != 0:
                raise RuntimeError("htp start failed")
        victim_host, attacker_host = hosts
        child = driver.pd_pid(sessions[1].fileno())
        assert child is not None
        victim_arena = Arena(victim_host, 1 << 16)
        x = victim_arena.tensor(F32, (64,))
        x.set(np.ones((1, 1, 1, 64)))

        def step() -> None:
            status = victim_host.run([OpSpec("SCALE", [x], [x], [f32_bits(1.0), 0])])
            if status != 1:
                raise RuntimeError(f"status {status}")

        arena = Arena(attacker_host, 1 << 16)
        src = arena.raw(4, F32, (elements,), (0, 0, 0, 0))
        dst = arena.raw(4, F32, (elements,), (0, 0, 0, 0))
        me = os.getpid()
        with _Victim(step) as victim, _Sampler(child) as dsp, _Sampler(me) as driver_side:
            time.sleep(settle_s)
            outcome.details["quiet_worst_ms"] = victim.worst * 1000
            victim.worst = 0.0
            outcome.rss_before_mib = driver_side.peak_rss / MIB  # the victim's quiet second
            outcome.fds_before = driver_side.peak_fds
            driver_side.peak_rss = driver_side.peak_fds = 0
            began = time.monotonic()
            attacker_host.submit([OpSpec("CPY", [src], [dst])])
            status = attacker_host.collect().status
            outcome.load_s = time.monotonic() - began
            outcome.answer = {1: "OK", 2: "INTERNAL_ERR", 3: "NO_SUPPORT", 4: "INVAL_PARAMS"}.get(
                status, str(status)
            )
            time.sleep(settle_s)
            outcome.details["attacker_dsp_peak_rss_mib"] = dsp.peak_rss / MIB
            outcome.details["attacker_dsp_alive"] = float(os.path.exists(f"/proc/{child}"))
            outcome.details["attacker_status"] = float(status)
            outcome.peak_rss_mib = driver_side.peak_rss / MIB
            outcome.peak_fds = driver_side.peak_fds
        outcome.victim_runs, outcome.victim_errors = victim.runs, victim.errors
        outcome.victim_worst_ms = victim.worst * 1000
        for host in hosts:
            host.close()
            host.queues.close()
    finally:
        for session in sessions:
            session.close()
        driver.shutdown()
    return outcome

"""Domains: what a shared model load saves, and what a DSP process of one's own costs.

``domains.shared_load_time`` and ``domains.shared_load_bytes``: two clients of one domain
load the same model file (the same bytes, the same shapes): 48 MiB of weights, a few KiB
of inputs and outputs. The second load is shared: the daemon knows the file's digest
(``npud.domain.digests``), finds the load in the domain's registry and adds only the
client's arena. Subject: the second load (its time at the client; what the daemon's
process tree, npud and its DSP processes, grew by in resident memory). Baseline: the
first load of the same model in the same round, by the other client. Both models are
unloaded at the end of each round, so every round starts from no load. Ratio: second
/ first. Goals (issue 17): at most 0.10 each.

``domains.churn``: clients come and go, each a process forked from this one (so no
interpreter start is timed): connect, allocate 64 KiB, map it, open the echo skel,
invoke it, close; every fifth is SIGKILLed while its call is on the DSP. Subject:
clients that each get a DSP process of their own (a rule with ``isolate = true``): 500
of them in a full run.
Baseline: the same clients in the shared default domain, batch by batch alternating.
Ratio: isolated time per client / shared time per client: what isolation costs a
client's whole life. After the run the daemon must be back where it started (one
domain, no client, no buffer, no mapping, no handle, the same fds, no DSP process
besides the default's): anything left over is an error, not a figure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import npu_client
from bench.harness import Context, Goal, Row, interleave, median, ratio_row
from bench.processes import npud_process, rss_bytes

NAME = "domains"
SUMMARY = "a second load of the same model (shared) vs the first; isolated vs shared churn"

ECHO: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
MODEL_MIB: Final = 48
CONFIG: Final = (
    "[client_limits]\nmax_model_bytes = 1073741824\n"
    "[limits]\nmax_clients = 256\n"
    "[uid_limits]\nmax_clients = 256\n"
    "[domains]\nmax_domains = 14\n"
    "[[domains.rule]]\nname = 'iso'\nclients = ['iso-*']\nisolate = true\n"
)


def _big_model(path: Path) -> None:
    """y = x @ w, with w a float32 initializer of MODEL_MIB MiB and y small: the weights
    are nearly all of the model, and the arena (each client's own) is a few KiB."""
    import numpy as np  # noqa: PLC0415 - the daemon's benches need no numpy
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    rows, columns = 4096, MODEL_MIB * 1024 * 1024 // 4 // 4096
    weights = numpy_helper.from_array(
        np.linspace(-1, 1, rows * columns, dtype=np.float32).reshape(rows, columns), name="w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, columns])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, path, save_as_external_data=False)


def tree_rss(pid: int) -> int:
    """Resident memory of ``pid`` and of every process descended from it."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            total += rss_bytes(current)
        pending += children_of(current)
    return total


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def descendants(pid: int) -> int:
    count, pending = 0, children_of(pid)
    while pending:
        count += 1
        pending += children_of(pending.pop())
    return count


def open_files(pid: int) -> dict[str, str]:
    """``pid``'s open fds: number -> what it refers to."""
    found = {}
    for entry in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found[entry] = os.readlink(f"/proc/{pid}/fd/{entry}")
    return found


# --- shared loads ----------------------------------------------------------------------


class _Loads:
    def __init__(self, socket_path: Path, pid: int, model: Path) -> None:
        self._first = npu_client.connect(str(socket_path), name="bench-load-a")
        self._second = npu_client.connect(str(socket_path), name="bench-load-b")
        self._pid = pid
        self._model = model
        self.times: list[tuple[float, float]] = []
        self.grown: list[tuple[int, int]] = []

    def round(self) -> None:
        before = tree_rss(self._pid)
        start = time.perf_counter()
        first = self._first.load_model(self._model)
        first_time = time.perf_counter() - start
        after_first = tree_rss(self._pid)
        start = time.perf_counter()
        second = self._second.load_model(self._model)
        second_time = time.perf_counter() - start
        after_second = tree_rss(self._pid)
        status = self._first.status()
        loads = sum(row.models for row in status.domains)
        if loads != 1:
            raise AssertionError(f"{loads} model loads held for one model: not shared")
        first.unload()
        second.unload()
        self.times.append((first_time, second_time))
        self.grown.append((max(after_first - before, 1), max(after_second - after_first, 0)))

    def close(self) -> None:
        self._first.close()
        self._second.close()


def _shared_load_rows(ctx: Context) -> list[Row]:
    model = ctx.workdir / "big.onnx"
    _big_model(model)
    rounds = ctx.rounds(5, 2)
    with npud_process(ctx.workdir, name="loads", extra_config=CONFIG) as (socket_path, pid):
        loads = _Loads(socket_path, pid, model)
        try:
            loads.round()  # warm: onnxruntime imported, the skel loaded
            loads.times.clear()
            loads.grown.clear()
            for index in range(rounds):
                ctx.progress(f"shared load round {index + 1}/{rounds}")
                loads.round()
        finally:
            loads.close()
    file_mib = model.stat().st_size / (1 << 20)
    return [
        ratio_row(
            "domains.shared_load_time",
            "second load (shared) / first load, same model, same domain",
            [second / first for first, second in loads.times],
            {
                "first_ms": median([first for first, _ in loads.times]) * 1000,
                "second_ms": median([second for _, second in loads.times]) * 1000,
                "model_mib": file_mib,
            },
            Goal("ratio", 0.10, "at_most"),
        ),
        ratio_row(
            "domains.shared_load_bytes",
            "resident memory the second load added / what the first added (npud + its DSP)",
            [second / first for first, second in loads.grown],
            {
                "first_mib": median([first for first, _ in loads.grown]) / (1 << 20),
                "second_mib": median([second for _, second in loads.grown]) / (1 << 20),
            },
            Goal("ratio", 0.10, "at_most"),
        ),
    ]


# --- churn -----------------------------------------------------------------------------


def _client_life(socket_path: Path, name: str, hold: bool) -> None:
    """One client's life, in a forked child: exits 0 when every step worked."""
    code = 1
    try:
        with npu_client.connect(str(socket_path), name=name) as client:
            buffer = client.alloc(64 * 1024)
            buffer.map()
            echo = client.open(ECHO)
            buffer.view()[:4] = b"ping"
            prim = struct.pack("<II", 4, 4)
            out = echo.invoke(2, [prim, buffer.slice(0, 4)], [4])
            if out != [b"ping"]:
                raise AssertionError(out)
            if hold:  # a victim: SIGKILLed while this call is on the DSP
                busy = client.open(TEST)
                os.write(1, b"")  # nothing: the parent kills on a timer
                busy.invoke(4, [struct.pack("<I", 2_000_000)], [])
        code = 0
    finally:
        os._exit(code)


@contextlib.contextmanager
def _forked(socket_path: Path, name: str, hold: bool) -> Iterator[int]:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _client_life(socket_path, name, hold)
    try:
        yield pid
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


class _Churn:
    def __init__(self, socket_path: Path, batch: int) -> None:
        self._socket = socket_path
        self._batch = batch
        self.clients = 0
        self.killed = 0
        self.failed = 0

    def run(self, prefix: str) -> float:
        """``batch`` clients one after the other; seconds per client."""
        start = time.perf_counter()
        for index in range(self._batch):
            victim = index % 5 == 4
            with _forked(self._socket, f"{prefix}-{self.clients}", victim) as pid:
                if victim:
                    time.sleep(0.15)  # its busy call is on the DSP by now
                    os.kill(pid, signal.SIGKILL)
                    self.killed += 1
                    continue
                _, status = os.waitpid(pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    self.failed += 1
            self.clients += 1
        return (time.perf_counter() - start) / self._batch


def _settled(
    client: npu_client.Client, pid: int, fds: int, deadline: float
) -> npu_client.DaemonStatus:
    """The status once the daemon let go of every departed client and is back to ``fds``
    open files (a connection's socket closes a moment after its client left the table),
    or at the deadline."""
    while True:
        status = client.status()
        back = (len(status.domains), status.totals.clients, len(open_files(pid))) == (1, 1, fds)
        if back or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def _steady(client: npu_client.Client, pid: int) -> dict[str, str]:
    """``pid``'s open files once only ``client`` is connected and they stopped changing:
    the start-up probe's connection may still be closing, and ``client``'s own may not
    have all its fds yet, when ``client.connect`` returns."""
    deadline = time.monotonic() + 10
    files = open_files(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = open_files(pid)
        if client.status().totals.clients == 1 and again == files:
            break
        files = again
    return files


def _churn_rows(ctx: Context) -> list[Row]:
    batches = ctx.rounds(10, 2)
    batch = ctx.rounds(50, 10)
    with (
        npud_process(ctx.workdir, name="churn", extra_config=CONFIG) as (socket_path, pid),
        npu_client.connect(str(socket_path), name="bench-watch") as watch,
    ):
        fds_before, processes_before = _steady(watch, pid), descendants(pid)
        churn = _Churn(socket_path, batch)
        churn.run("warm")
        isolated, shared = interleave(batches, lambda: churn.run("iso"), lambda: churn.run("plain"))
        status = _settled(watch, pid, len(fds_before), time.monotonic() + 30)
        memory = status.memory
        left = {
            "domains": len(status.domains) - 1,
            "clients": status.totals.clients - 1,
            "buffers": memory.buffers if memory is not None else 0,
            "mappings": status.domains[0].mappings,
            "handles": status.domains[0].remote_handles,
            "fds": len(open_files(pid)) - len(fds_before),
            "dsp_processes": descendants(pid) - processes_before,
        }
        now = set(open_files(pid).items())
        new_fds = sorted(now - set(fds_before.items()))
        gone_fds = sorted(set(fds_before.items()) - now)
    leftovers = {what: count for what, count in left.items() if count}
    if leftovers or churn.failed:
        raise AssertionError(
            f"churn left {leftovers} (new fds: {new_fds}, gone: {gone_fds}) and"
            f" {churn.failed} clients failed"
        )
    return [
        ratio_row(
            "domains.churn",
            "a client's life in a DSP process of its own / in the shared domain",
            [i / s for i, s in zip(isolated, shared, strict=True)],
            {
                "isolated_ms": median(isolated) * 1000,
                "shared_ms": median(shared) * 1000,
                "clients": churn.clients + churn.killed,
                "killed": churn.killed,
            },
        )
    ]


def rows(ctx: Context) -> list[Row]:
    return [*_shared_load_rows(ctx), *_churn_rows(ctx)]

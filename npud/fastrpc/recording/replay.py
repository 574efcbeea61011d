"""Playing a trace back against FastRpcSession: the first divergence, by call number and field.

:func:`replay` reads a trace (docs/trace-format.md), runs every recorded
session operation again on a FastRpcSession whose driver is a
:class:`ReplayDriver`, and compares each Driver call the session makes with
the recorded one, field by field. The driver answers with what the device
answered then: return values, errnos, the struct fields the kernel wrote, the
bytes the DSP wrote into output buffers. So the session code of today is
checked against a device of the past, in CI, without the device.

Order. Operations run on one thread per recorded thread, and every event
(an operation's start and end, a call's start and end, the listener's calls
included) happens in the recorded order: a thread waits for its turn. The
session's own listener thread replays the recorded listener's calls.

What must match: the call's kind and device (``dev0``), the request, every
struct field (fds and pointers in their stable forms), every invoke argument
and the bytes of the inputs, and each operation's result or error code. What
is given back: return values, errnos, output fields, output bytes.

Limits: a trace whose DSP read files by absolute path (get_search_paths_with_env)
replays only with the same library directories; names the daemon generated
(``npud-fd-...``) are substituted; host files come from the trace's ``file``
records (into a temporary directory) unless a library path is given.

The parts: :mod:`.trace_file` reads the trace, :mod:`.replay_driver` answers and
checks the Driver calls in the recorded order, :mod:`.replay_operations` runs the
recorded session operations; this module runs them on their threads and reports.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from npu_protocol import CodedError
from npud.fastrpc.kernel.trace_hooks import Record
from npud.fastrpc.recording.replay_driver import (
    DEFAULT_TIMEOUT,
    AbortedError,
    Divergence,
    ReplayDriver,
)
from npud.fastrpc.recording.replay_operations import ReplayState
from npud.fastrpc.recording.trace_file import Trace, TraceFormatError, load_trace
from npud.fastrpc.recording.trace_format import decode_data, same_data

__all__ = [
    "DEFAULT_TIMEOUT",
    "Divergence",
    "ReplayDriver",
    "ReplayReport",
    "Trace",
    "TraceFormatError",
    "load_trace",
    "replay",
]


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    calls: int
    ops: int
    replayed: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        if self.divergence is None:
            return f"replayed {self.replayed} calls in {self.ops} operations: no divergence"
        return f"first divergence: {self.divergence}"


class _Replayer(ReplayState):
    """Runs the recorded operations, one thread per recorded thread, and compares
    each outcome with the recorded one."""

    def __init__(self, trace: Trace, driver: ReplayDriver, library: Path) -> None:
        super().__init__(driver, library)
        self.trace = trace
        self.format_error: TraceFormatError | None = None

    def run(self) -> None:
        by_thread: dict[str, list[Record]] = collections.defaultdict(list)
        for op in self.trace.ops:
            by_thread[str(op.get("thread", "?"))].append(op)
        threads = [
            threading.Thread(target=self._thread, args=(ops,), name=f"replay-{name}", daemon=True)
            for name, ops in by_thread.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _thread(self, ops: list[Record]) -> None:
        driver = self.driver
        for op in ops:
            try:
                driver.sequencer.wait(int(op["start"]))
                driver.expect_op(op)
                try:
                    outcome = self.run_operation(op)
                    error: str | None = None
                except CodedError as exc:
                    outcome, error = None, exc.code.name
                except (OSError, ValueError) as exc:
                    outcome, error = None, type(exc).__name__
                finally:
                    driver.expect_op(None)
                if driver.sequencer.aborted:
                    return
                self._compare(op, outcome, error)
                driver.sequencer.wait(int(op["end"]))
            except AbortedError:
                return
            except (TraceFormatError, KeyError, TypeError) as exc:
                # The trace itself is wrong (hand-edited, another writer): stop, say where.
                self.format_error = TraceFormatError(f"op {op.get('id')}: {exc}")
                driver.sequencer.abort()
                return

    def _compare(self, op: Record, outcome: Record | None, error: str | None) -> None:
        recorded_error = (op.get("error") or {}).get("code")
        where = f"{op['op']}"
        if recorded_error != error:
            self.driver.diverge(
                Divergence(None, int(op["id"]), "error", recorded_error, error, where)
            )
        if outcome is None or "result" not in op:
            return
        for key, expected in (op.get("result") or {}).items():
            actual = outcome.get(key, expected)
            if key == "outputs" and isinstance(expected, list) and isinstance(actual, list):
                for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
                    if want is None or got is None:
                        continue
                    if not same_data(want, self.driver.to_recorded(decode_data(got) or b"")):
                        self.driver.diverge(
                            Divergence(
                                None, int(op["id"]), f"result.outputs[{index}]", want, got, where
                            )
                        )
            elif expected != actual:
                self.driver.diverge(
                    Divergence(None, int(op["id"]), f"result.{key}", expected, actual, where)
                )


def replay(
    trace: Trace | str | os.PathLike[str],
    *,
    library_path: Sequence[Path] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ReplayReport:
    """Play ``trace`` back against FastRpcSession; the report names the first divergence.

    Host files come from ``library_path`` when given, else from the trace's
    ``file`` records (written to a temporary directory for the replay).
    """
    loaded = trace if isinstance(trace, Trace) else load_trace(trace)
    driver = ReplayDriver(loaded, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="npud-replay-") as scratch:
        if library_path:
            library = Path(library_path[0])
        else:
            library = Path(scratch)
            for record in loaded.files:
                data = decode_data(record["data"])
                name = os.path.basename(str(record["name"]))
                if data is not None and name:
                    (library / name).write_bytes(data)
        replayer = _Replayer(loaded, driver, library)
        try:
            replayer.run()
        finally:
            stuck = driver.sequencer.stuck_at
            driver.sequencer.abort()
            replayer.close_leftovers()
            driver.close_all()
    if replayer.format_error is not None:
        raise replayer.format_error
    divergence = driver.divergence
    if divergence is None and stuck is not None:
        divergence = Divergence(
            None, None, "order", driver.sequencer.owner(stuck), "never got there", "waiting"
        )
    if divergence is None and driver.sequencer.next_event is not None and loaded.complete:
        missing = driver.sequencer.next_event
        divergence = Divergence(
            None, None, "call", driver.sequencer.owner(missing), "did not make it", "end of replay"
        )
    return ReplayReport(len(loaded.calls), len(loaded.ops), driver.calls_replayed, divergence)

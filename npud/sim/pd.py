"""Where a simulated DSP process runs its skels: ``SimConfig.pd_isolation``.

* ``"thread"`` (:class:`LocalRunner`): skel instances live in npud's process
  and their methods run on the calling thread, holding its GIL (the emulator's
  behaviour before PD processes).
* ``"process"`` (:class:`ProcessRunner`): the DSP process has a child process
  (:mod:`npud.sim.pd_host`); the instances live there and their methods run
  there, on one of its threads per concurrent call. What a method asks of the
  driver while it runs (DSP work on the shared compute, host files through
  reverse RPC) is served by the thread waiting for it.

Either way the DSP process (:mod:`npud.sim.process`) keeps remotectl, the
listener, the heap and the kernel's records in npud's process; a runner
only makes instances, runs methods and, for a child, mirrors the memories the
DSP may reach (:meth:`ProcessRunner.bind`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from npud.sim.errors import LoadError
from npud.sim.pd_child_handle import CallServices, CallTransfer, DspReport, PdChild, PdGoneError
from npud.sim.pd_services import EndReason, PdServices
from npud.sim.skels import HostFiles, Skel, SkelCall, SkelFactory, run_method

if TYPE_CHECKING:
    from npud.sim.memory import MemMapping


@dataclasses.dataclass(frozen=True)
class DspCall:
    """An invocation as it reaches the DSP: buffers already copied in or mapped.

    ``transfer`` says where each buffer is, for a process whose skels run in a child."""

    handle: int
    sc: int
    inputs: Sequence[memoryview]
    outputs: Sequence[memoryview]
    transfer: CallTransfer | None = None
    report: DspReport = dataclasses.field(default_factory=DspReport)
    """What the DSP reported with its answer (``SkelCall.report_dsp_seconds``)."""


class SkelInstance(Protocol):
    """One open remote handle's skel, wherever it runs."""

    def invoke(self, call: DspCall, *, crash: bool = False) -> int:
        """The method's AEE result; PdGoneError when its child ended meanwhile."""
        ...

    def close(self) -> None:
        """remotectl close (or the process's end): the skel's close hook runs."""
        ...


class SkelRunner(Protocol):
    def instantiate(self, name: str, factory: SkelFactory, method_offset: int) -> SkelInstance:
        """A new instance; LoadError when it cannot be made, PdGoneError when the child
        is gone."""
        ...

    def bind(self, mapping: MemMapping, fd: int) -> None:
        """A MEM_MAP of the process (``fd``: the number it was made through, open now)."""
        ...

    def unbind(self, mapping: MemMapping) -> None: ...

    def drop(self, memory_ids: Sequence[int]) -> None:
        """Buffers the driver stopped caching: no call will name them again."""
        ...

    def end(self, reason: EndReason) -> None:
        """The process ends (``reason``: an exit or a restart): stop everything that runs
        for it, at once."""
        ...

    @property
    def child(self) -> PdChild | None: ...


class LocalMeter:
    """Thread isolation: a call's pieces of work (SkelCall.computing) go straight to
    the process's shared compute; those still begun when the call ends are dropped."""

    def __init__(self, services: CallServices) -> None:
        self._services = services
        self._jobs: dict[int, object] = {}
        self._count = 0

    def begin(self, matrix: bool, started: float | None = None) -> int:
        self._count += 1
        self._jobs[self._count] = self._services.work_begin(matrix, started)
        return self._count

    def end(self, job: int, seconds: float) -> None:
        self._services.work_end(self._jobs.pop(job), seconds)

    def close(self) -> None:
        for job in self._jobs.values():
            self._services.work_drop(job)
        self._jobs.clear()


class LocalSkel:
    def __init__(
        self,
        skel: Skel,
        method_offset: int,
        work: Callable[[float], None],
        host_files: HostFiles,
        pd: PdServices,
        services: CallServices | None = None,
    ) -> None:
        self.skel = skel
        self._method_offset = method_offset
        self._work = work
        self._host_files = host_files
        self._pd = pd
        self._services = services

    def invoke(self, call: DspCall, *, crash: bool = False) -> int:
        services = self._services
        meter = LocalMeter(services) if services is not None and services.metered else None
        skel_call = SkelCall(
            call.sc,
            call.inputs,
            call.outputs,
            self._work,
            self._host_files,
            pd=self._pd,
            meter=meter,
        )
        try:
            return run_method(self.skel, self._method_offset, skel_call)
        finally:
            call.report.dsp_seconds = skel_call.reported_dsp_seconds
            if meter is not None:
                meter.close()

    def close(self) -> None:
        self.skel.close()


class LocalRunner:
    """Thread isolation: instances in npud's process, methods on the caller's thread;
    the PD's own threads (:class:`PdServices`) in npud's process too, joined at its end."""

    def __init__(
        self,
        work: Callable[[float], None],
        host_files: HostFiles,
        pd: PdServices,
        services: CallServices | None = None,
    ) -> None:
        self._work = work
        self._host_files = host_files
        self._pd = pd
        self._services = services

    @property
    def child(self) -> PdChild | None:
        return None

    def instantiate(self, name: str, factory: SkelFactory, method_offset: int) -> SkelInstance:
        return LocalSkel(
            factory(), method_offset, self._work, self._host_files, self._pd, self._services
        )

    def bind(self, mapping: MemMapping, fd: int) -> None:
        pass  # the DSP's code finds MEM_MAP'd buffers in the process's own records

    def unbind(self, mapping: MemMapping) -> None:
        pass

    def drop(self, memory_ids: Sequence[int]) -> None:
        pass

    def end(self, reason: EndReason) -> None:
        # Calls running on callers' threads finish (or stop at their next wait); the
        # PD's own threads stop and are joined, its residents let go of its memory.
        self._pd.end(reason)


class RemoteSkel:
    def __init__(
        self, child: PdChild, instance: int, method_offset: int, services: CallServices
    ) -> None:
        self._child = child
        self._instance = instance
        self._method_offset = method_offset
        self._services = services

    def invoke(self, call: DspCall, *, crash: bool = False) -> int:
        if call.transfer is None:
            raise ValueError("a call for a PD child needs its transfer description")
        return self._child.invoke(
            self._instance,
            self._method_offset,
            call.sc,
            call.transfer,
            call.outputs,
            self._services,
            crash=crash,
            report=call.report,
        )

    def close(self) -> None:
        if self._child.killed:
            return  # it died with its process
        with contextlib.suppress(PdGoneError):  # a crash: the next call notices it
            self._child.destroy(self._instance)


class ProcessRunner:
    """Process isolation: instances and methods in the process's child."""

    def __init__(self, child: PdChild, services: CallServices) -> None:
        self._child = child
        self._services = services

    @property
    def child(self) -> PdChild | None:
        return self._child

    def instantiate(self, name: str, factory: SkelFactory, method_offset: int) -> SkelInstance:
        try:
            blob = pickle.dumps(factory)
        except Exception as exc:
            raise LoadError(
                f"skel {name!r}: its factory cannot be sent to the PD process ({exc}); a"
                " factory must be importable by name (a class or a module-level function)"
            ) from None
        try:
            instance = self._child.create(name, blob)
        except ValueError as exc:
            raise LoadError(str(exc)) from None
        return RemoteSkel(self._child, instance, method_offset, self._services)

    def bind(self, mapping: MemMapping, fd: int) -> None:
        try:
            if mapping.alias_of is not None:
                self._child.bind_alias(
                    mapping.id, mapping.alias_of, mapping.fd, mapping.offset, mapping.length
                )
            else:
                self._child.bind_fd(
                    mapping.id, fd, mapping.buffer.size, mapping.offset, mapping.length
                )
        except PdGoneError:
            pass  # the child crashed: the next call finds out

    def unbind(self, mapping: MemMapping) -> None:
        self._child.drop([mapping.id])

    def drop(self, memory_ids: Sequence[int]) -> None:
        self._child.drop(memory_ids)

    def end(self, reason: EndReason) -> None:
        self._child.kill()  # its threads and mappings go with it

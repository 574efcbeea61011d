"""Skels of the simulated DSP, written in Python and marshalled by the qaic rules.

A skel is what a ``lib<name>_skel.so`` would contain on the device. The
simulated DSP binds one when a remotectl open names a library whose descriptor
(see :mod:`npud.sim.loader`) says ``skel=<name>``. Method numbering follows the
entry symbol: ``<name>_skel_handle_invoke`` is a remote_handle64 ("domain")
interface whose user methods start at 2 (0 and 1 are open/close, run by
remotectl itself); ``<name>_skel_invoke`` is a plain interface numbered from 0.

Interfaces (idl/echo.idl, idl/npu_test.idl), domain method numbers and sc:

* echo.echo(in sequence<octet> in_buf, rout sequence<octet> out_buf)
  method 2, sc 0x02020100; primIn {u32 len(in_buf), u32 capacity(out_buf)}.
  Copies min(len, capacity) bytes and zero-fills the rest.
* npu_test.fill(in uint32 seed, rout sequence<octet> buf)
  method 2, sc 0x02010100; primIn {u32 seed, u32 capacity}; buf[i] = (seed + i) & 0xFF.
* npu_test.checksum(in sequence<octet> buf, rout uint32 crc)
  method 3, sc 0x03020100; primIn {u32 len(buf)}; primROut {u32 zlib.crc32(buf)}.
* npu_test.busy(in uint32 microseconds)
  method 4, sc 0x04010000; primIn {u32 us}; does that much DSP work: as long
  as alone, longer while other calls share the DSP's units (SimConfig.dsp_units);
  a subsystem restart interrupts it and the invoke fails with EPIPE.
* npu_test.fault()
  method 5, sc 0x05000000; the skel faults (:class:`SkelFaultError`): its DSP
  process dies in the middle of the call, as a real skel's bad pointer kills its PD.

* portal_qnn (idl/portal_qnn.idl): ONNX models on onnxruntime, in
  :mod:`npud.sim.portal_qnn` (imported when a process first opens it).
* dspqueue_rpc (qualcomm/fastrpc's dspqueue_rpc.idl, methods 2-8): the DSP side of
  dspqueue's shared-memory queues, in :mod:`npud.sim.skels_dspqueue`.
* htp_iface (llama.cpp's ggml-hexagon ``htp_iface.idl``, methods 2-8): the DSP side of
  llama.cpp's Hexagon backend, op batches on a dspqueue, in :mod:`npud.sim.htp`.

The layouts come from the IDL files themselves (:mod:`npud.idl`, pure
and independent of ``npud.fastrpc.kernel.abi``), so a skel and its IDL cannot drift.
Every method checks the counts in ``sc`` and that the lengths announced in
primIn equal the buffers it got; any mismatch is AEE_EBADPARM. An unknown
method is AEE_EUNSUPPORTED.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Final, Protocol

from npu_protocol.aee import AEE
from npud.sim.layout import decode_scalars
from npud.sim.pd_services import PdServices

if TYPE_CHECKING:
    from npud import idl

DOMAIN_METHOD_OFFSET: Final = 2
"""remote_handle64 interfaces number user methods from 2 (0 = open, 1 = close)."""

ESCAPE_METHOD: Final = 31
"""qaic's escape for interfaces with more than 31 methods (the id is then in primIn)."""
MAX_REPORTED_SECONDS: Final = 86400.0
"""The most DSP time a call may report (a day): more is a bug of the skel."""


class BadParameterError(Exception):
    """Marshalled arguments that do not match the method: AEE_EBADPARM."""


class SkelFaultError(Exception):
    """Skel code faulted: its DSP process dies (as a bad pointer kills a real PD)."""


class HostFileError(Exception):
    """A file the DSP process could not read from the host; ``code`` is the AEE result."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class HostFiles(Protocol):
    """How DSP code reads a file from the host: apps_std through the reverse-RPC listener."""

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """The whole file ``name`` (at most ``limit`` bytes); HostFileError otherwise."""
        ...


class _NoHostFiles:
    def read_host_file(self, name: str, *, limit: int) -> bytes:
        raise HostFileError(f"{name}: this DSP process has no reverse-RPC channel", AEE.EFAILED)


class ComputeMeter(Protocol):
    """How a call reaches the DSP's shared compute for work done on the host's CPUs
    (:meth:`npud.sim.compute.SharedCompute.begin` / ``end``), by job number."""

    def begin(self, matrix: bool, started: float | None = None) -> int:
        """A piece of work starts (``matrix``: it needs the HMX); its number.
        ``started``: its ``time.monotonic()`` when it began before this call (None: now)."""
        ...

    def end(self, job: int, seconds: float) -> None:
        """Piece ``job`` took ``seconds`` on the host: wait until the model credited it."""
        ...


class SkelCall:
    """One invocation as a skel sees it: buffers in qaic order, a way to wait, host files,
    and ``pd``, what the DSP process offers beyond the call (memory by fd, per-process
    state, threads: :class:`npud.sim.pd_services.PdServices`; None outside a process).
    ``meter``: the call's way to the DSP's shared compute (None when the emulator does
    not model it: ``SimConfig.dsp_units`` and ``hmx_units`` both 0)."""

    __slots__ = (
        "_sleep",
        "host_files",
        "inputs",
        "meter",
        "outputs",
        "pd",
        "reported_dsp_seconds",
        "sc",
    )

    def __init__(
        self,
        sc: int,
        inputs: Sequence[memoryview],
        outputs: Sequence[memoryview],
        sleep: Callable[[float], None],
        host_files: HostFiles | None = None,
        *,
        pd: PdServices | None = None,
        meter: ComputeMeter | None = None,
    ) -> None:
        self.sc = sc
        self.inputs = inputs
        self.outputs = outputs
        self._sleep = sleep
        self.host_files: HostFiles = host_files if host_files is not None else _NoHostFiles()
        self.pd = pd
        self.meter = meter
        self.reported_dsp_seconds: float | None = None
        """What :meth:`report_dsp_seconds` told (None: nothing)."""

    def report_dsp_seconds(self, seconds: float) -> None:
        """Tell the driver, with this call's answer, the DSP time of the work it answers
        for (dspqueue's ``wait_signal``: the packets its process handled since its last
        answer); the driver gives it to its caller (``Driver.dsp_report``). A value
        outside 0..86400 s, or not finite, is a bug of the skel: ValueError."""
        if not 0.0 <= seconds <= MAX_REPORTED_SECONDS:
            raise ValueError(f"a DSP time of {seconds!r} s")
        self.reported_dsp_seconds = seconds

    def work(self, seconds: float) -> None:
        """Spend ``seconds`` of DSP time: shared with the calls running beside it when the
        emulator models the DSP's units (``SimConfig.dsp_units``); a subsystem restart
        interrupts it (the invoke then fails with EPIPE)."""
        self._sleep(seconds)

    @contextlib.contextmanager
    def computing(self, *, matrix: bool = False) -> Iterator[None]:
        """The block is DSP work done on the host's CPUs (a graph run in numpy): it joins
        the shared compute at entry, and at exit waits until the model credited the CPU
        time its thread spent in it (no wait when it had the DSP alone; nothing without a
        meter). CPU time, not wall time: the time the host's scheduler kept the thread
        off a CPU (other processes, the GIL) is the host's, not work the DSP did
        (docs/emulator.md, "Concurrency"). ``matrix``: it needs the HMX unit too
        (``SimConfig.hmx_units``)."""
        meter = self.meter
        if meter is None:
            yield
            return
        started = time.monotonic()
        cpu = time.thread_time()
        job = meter.begin(matrix, started)
        try:
            yield
        finally:
            meter.end(job, time.thread_time() - cpu)

    def prim_in(self, layout: struct.Struct) -> tuple[int, ...]:
        """Unpack primIn (input buffer 0), which must have exactly ``layout.size`` bytes."""
        return _unpack_exact(self.inputs[0], layout, "primIn")

    def unpack(self, method: idl.Method) -> idl.Values:
        """The arguments, checked against ``method``'s IDL layout (MarshalError: EBADPARM)."""
        return method.unpack(self.inputs, self.outputs)

    def pack_routs(self, method: idl.Method, values: Mapping[str, object]) -> None:
        """Write rout values (call it only when returning 0)."""
        method.pack_routs(self.outputs, values)


def _unpack_exact(view: memoryview, layout: struct.Struct, what: str) -> tuple[int, ...]:
    if len(view) != layout.size:
        raise BadParameterError(f"{what} has {len(view)} bytes, expected {layout.size}")
    return layout.unpack(view)


SkelMethodHandler = Callable[[SkelCall], int]


@dataclasses.dataclass(frozen=True)
class SkelMethod:
    """One user method: its buffer counts (primIn/primROut included) and its body."""

    name: str
    inbufs: int
    outbufs: int
    handler: SkelMethodHandler

    @classmethod
    def of(cls, method: idl.Method, handler: SkelMethodHandler) -> SkelMethod:
        return cls(method.name, method.inbufs, method.outbufs, handler)


def idl_methods(
    interface: idl.Interface, handlers: Mapping[str, SkelMethodHandler]
) -> Mapping[int, SkelMethod]:
    """``Skel.methods()`` for an IDL interface: every user method needs its handler."""
    user = interface.user_methods
    missing = {m.name for m in user} ^ set(handlers)
    if missing:
        raise ValueError(f"{interface.name}: handlers do not match the IDL: {sorted(missing)}")
    first = user[0].index if user else 0
    return {m.index - first: SkelMethod.of(m, handlers[m.name]) for m in user}


class Skel(abc.ABC):
    """Base of the Python skels; one instance per open remote handle."""

    name: ClassVar[str]
    faults: ClassVar[frozenset[str]] = frozenset()
    """Methods that fault on purpose (the DSP process crashes): fault injection, which
    npud runs only for root and ``[emulator] fault_uids`` (:mod:`npud.sim.fault_methods`)."""

    @abc.abstractmethod
    def methods(self) -> Mapping[int, SkelMethod]:
        """User methods numbered from 0 (the domain offset is added by the caller)."""

    def close(self) -> None:  # noqa: B027 - an optional hook; stateless skels keep it empty
        """The handle is being closed (remotectl close, process exit or teardown)."""


SkelFactory = Callable[[], Skel]


@functools.cache
def load_idl(name: str) -> idl.Interface:
    """``idl/<name>.idl``, parsed when a skel of it is first opened (then cached): a
    daemon whose DSP processes run in child processes never parses them itself."""
    from npud import idl  # noqa: PLC0415  (see the docstring)

    return idl.load(name)


class EchoSkel(Skel):
    """``interface echo : remote_handle64``: one method, echo (see idl/echo.idl)."""

    name = "echo"

    def __init__(self) -> None:
        interface = load_idl("echo")
        self._echo_method = interface.method("echo")
        self._methods = idl_methods(interface, {"echo": self._echo})

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    def _echo(self, call: SkelCall) -> int:
        args = call.unpack(self._echo_method)
        source, target = args.view("in_buf"), args.view("out_buf")
        count = min(len(source), len(target))
        target[:count] = source[:count]
        target[count:] = bytes(len(target) - count)
        return 0


class NpuTestSkel(Skel):
    """Test methods for the daemon: fill, checksum, busy and fault (the module docstring)."""

    name = "npu_test"
    faults = frozenset({"fault"})

    def __init__(self) -> None:
        interface = load_idl("npu_test")
        self._fill_method = interface.method("fill")
        self._checksum_method = interface.method("checksum")
        self._busy_method = interface.method("busy")
        self._methods = idl_methods(
            interface,
            {
                "fill": self._fill,
                "checksum": self._checksum,
                "busy": self._busy,
                "fault": self._fault,
            },
        )

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    def _fill(self, call: SkelCall) -> int:
        args = call.unpack(self._fill_method)
        target = args.view("buf")
        start = args.integer("seed") & 0xFF
        cycle = bytes(range(start, 256)) + bytes(range(start))
        target[:] = (cycle * (len(target) // 256 + 1))[: len(target)]
        return 0

    def _checksum(self, call: SkelCall) -> int:
        args = call.unpack(self._checksum_method)
        call.pack_routs(self._checksum_method, {"crc": zlib.crc32(args.view("buf"))})
        return 0

    def _busy(self, call: SkelCall) -> int:
        args = call.unpack(self._busy_method)
        call.work(args.integer("microseconds") / 1_000_000)
        return 0

    @classmethod
    def _fault(cls, call: SkelCall) -> int:
        raise SkelFaultError("npu_test.fault: the skel faulted on purpose")


def run_method(skel: Skel, method_offset: int, call: SkelCall) -> int:
    """Dispatch ``call`` to ``skel`` like a qaic ``*_skel_invoke`` would; returns the AEE result."""
    scalars = decode_scalars(call.sc)
    if scalars.method == ESCAPE_METHOD:
        return AEE.EUNSUPPORTED.dsp  # no simulated interface has more than 31 methods
    method = skel.methods().get(scalars.method - method_offset)
    if method is None:
        return AEE.EUNSUPPORTED.dsp
    if scalars.counts != (method.inbufs, method.outbufs, 0, 0):
        return AEE.EBADPARM.dsp
    try:
        return method.handler(call)
    except BadParameterError:
        return AEE.EBADPARM.dsp
    except ValueError as exc:
        from npud.idl import MarshalError  # noqa: PLC0415  (loaded with the skel's IDL)

        if isinstance(exc, MarshalError):
            return AEE.EBADPARM.dsp
        raise

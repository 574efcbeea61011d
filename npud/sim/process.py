"""A simulated DSP process: what INIT_CREATE (or INIT_ATTACH) creates for an fd.

It answers the static handles a client talks to, and the remote handles it
opened:

* 0 ``remotectl`` (and 8, ``remotectl1``): open (method 0 / 2, sc 0x00020200)
  and close (method 1 / 3, sc 0x01010200) with the layouts of reference 5.3;
* 3 ``adsp_listener`` (and 7, ``adsp_listener1``): init2, next2 and
  get_in_bufs2 (methods 3/4/5, or 5/6/7), the reverse-RPC pump;
* 4 ``adsp_current_process1``: method 2 ``exit`` (sc 0x02000000);
* 2, 5, 6, 9, 10: modules this DSP does not have: ``SimConfig.absent_module_result``
  (AEE_ENOSUCHMOD by default); so are 7 and 8 with ``domain_handles=False``;
* any other number: a remote handle from remotectl open (AEE_EINVHANDLE when
  unknown or closed; handles are never reused within a process).

Once the process exited (handle 4 exit) every invoke answers AEE_EBADSTATE.

Where the skels of its remote handles run is its runner's business
(:mod:`npud.sim.pd`): on the caller's thread, or in the process's own child
process (``SimConfig.pd_isolation``). When the process ends (exit, close of
its fd, a subsystem restart) its child is killed and every call still running
there returns at once: AEE_EBADSTATE, or EPIPE for a restart. A child that
dies on its own is a crash of the process: the calls waiting on it and every
later invoke answer AEE_EBADSTATE, and the listener's next2 returns it too
(reference 5.6: "the process is dead", the listener stops).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import struct
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from npu_protocol.aee import AEE
from npud import idl
from npud.sim.apps_mem import DspHeap
from npud.sim.compute import Cancellation, Job, SharedCompute
from npud.sim.config import SimConfig
from npud.sim.errors import (
    ListenerInterruptedError,
    LoadError,
    ProcessExitedError,
    SubsystemDownError,
)
from npud.sim.host_calls import HostChannel
from npud.sim.host_files import HostFileReader
from npud.sim.layout import decode_scalars
from npud.sim.loader import LoadedSkel, SkelLoader
from npud.sim.memory import MemMapping, ProcessMemory
from npud.sim.pd import DspCall, LocalRunner, ProcessRunner, SkelInstance, SkelRunner
from npud.sim.pd_child_handle import PdChild, PdGoneError
from npud.sim.pd_services import FdMemory, PdServices
from npud.sim.reverse import BadReverseMessageError, ListenerNotReadyError, ReverseRpc
from npud.sim.skels import SkelFactory, SkelFaultError

if TYPE_CHECKING:
    import mmap

    from npud.sim.dmabuf import DmaBuf

log = logging.getLogger(__name__)

_REMOTECTL: Final = idl.load("remotectl")
_REMOTECTL1: Final = idl.load("remotectl1")
_LISTENER: Final = idl.load("adsp_listener")
_LISTENER1: Final = idl.load("adsp_listener1")
REMOTECTL_METHODS: Final = {  # handle -> (open, close), from idl/remotectl*.idl
    0: (_REMOTECTL.method("open"), _REMOTECTL.method("close")),
    8: (_REMOTECTL1.method("open1"), _REMOTECTL1.method("close1")),
}
LISTENER_METHODS: Final = {  # handle -> (init2, next2, get_in_bufs2), from idl/adsp_listener*.idl
    handle: (interface.method("init2"), interface.method("next2"), interface.method("get_in_bufs2"))
    for handle, interface in ((3, _LISTENER), (7, _LISTENER1))
}
DOMAIN_HANDLES: Final = frozenset({7, 8})  # adsp_listener1, remotectl1: newer firmware
CURRENT_PROCESS_HANDLE: Final = 4
EXIT: Final = idl.load("adsp_current_process1").method("exit")
LAST_STATIC_HANDLE: Final = 10
MAX_HANDLES_PER_PROCESS: Final = 0xFFFFF

ELF_MAGIC: Final = b"\x7fELF"
ELFCLASS32: Final = 1
ELFDATA2LSB: Final = 1
EM_QDSP6: Final = 164
ELF32_HEADER_SIZE: Final = 52


def is_hexagon_elf(image: bytes) -> bool:
    """The shell check of the simulated DSP: an ELF32 little-endian file for EM_QDSP6."""
    if len(image) < ELF32_HEADER_SIZE or image[:4] != ELF_MAGIC:
        return False
    if image[4] != ELFCLASS32 or image[5] != ELFDATA2LSB:
        return False
    (machine,) = struct.unpack_from("<H", image, 18)
    return bool(machine == EM_QDSP6)


class ProcessKind(enum.Enum):
    USER_PD = "user PD (INIT_CREATE)"
    ROOT_PD = "root PD (INIT_ATTACH)"


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """What the INIT ioctl told the DSP; kept for tests and statistics."""

    kind: ProcessKind
    client_id: int
    attrs: int = 0
    siglen: int = 0
    image_size: int = 0

    @property
    def unsigned(self) -> bool:
        """FASTRPC_MODE_UNSIGNED_MODULE (0x8): an unsigned PD."""
        return bool(self.attrs & 0x8)

    @property
    def create_method(self) -> int | None:
        """The kernel's remote method: 6 INIT_CREATE, 7 INIT_CREATE_ATTR (attrs != 0)."""
        if self.kind is not ProcessKind.USER_PD:
            return None
        return 7 if self.attrs else 6


class _BadCallError(Exception):
    """Arguments that do not fit the static method: AEE_EBADPARM."""


def _expect_counts(call: DspCall, inbufs: int, outbufs: int) -> None:
    if decode_scalars(call.sc).counts != (inbufs, outbufs, 0, 0):
        raise _BadCallError


def _unpack(call: DspCall, method: idl.Method) -> idl.Values:
    """The call's arguments, checked against ``method`` (from its IDL)."""
    _expect_counts(call, method.inbufs, method.outbufs)
    try:
        return method.unpack(call.inputs, call.outputs)
    except idl.MarshalError:
        raise _BadCallError from None


def _reply(call: DspCall, method: idl.Method, values: dict[str, object]) -> None:
    """Write ``method``'s rout scalars (primROut) into the call's outputs."""
    method.pack_routs(call.outputs, values)


def _s32(result: int) -> int:
    """A u32 AEE result as the int32 nErr carries it."""
    result &= 0xFFFFFFFF
    return result - (1 << 32) if result & 0x80000000 else result


def _write_text(target: memoryview, text: str) -> None:
    """A NUL-terminated message, truncated to the buffer."""
    if len(target) == 0:
        return
    data = text.encode("utf-8")[: len(target) - 1] + b"\0"
    target[: len(data)] = data


class _Ending:
    """What stops a call's DSP work (``SkelCall.work``): the process's end, or its
    child's death, noticed here (the work asks every 50 ms) when no other call of the
    process reads the child's socket to find it out."""

    def __init__(self, process: DspProcess) -> None:
        self._process = process

    def is_set(self) -> bool:
        process = self._process
        if process._gone.is_set():
            return True
        if process.child is not None and not process.check_child():
            return True
        return process._gone.is_set()


class DspProcess:
    """One process on the simulated DSP, bound to one device fd."""

    def __init__(
        self,
        info: ProcessInfo,
        config: SimConfig,
        sleep: Callable[[float, Cancellation | None], None],
        child: PdChild | None = None,
        on_crash: Callable[[DspProcess], None] | None = None,
        compute: SharedCompute | None = None,
    ) -> None:
        """``child``: the process's PD child (process isolation), None to run skels on
        the callers' threads; ``on_crash`` hears of a crash (once); ``compute``: the
        channel's shared compute, for work skel code does on the host's CPUs
        (SkelCall.computing; None: not charged)."""
        self._compute = compute
        self.info = info
        self.memory = ProcessMemory()
        self.reverse = ReverseRpc()
        host = HostChannel(self.reverse, config.reverse_rpc_timeout)
        self.heap = DspHeap(config.heap_for(info.image_size), host)
        files = HostFileReader(host, self.memory, config.loader_paths)
        self._loader = SkelLoader(
            files, self.heap, config.skels, self._instantiate, config.loader_probes
        )
        self._runner: SkelRunner
        if child is None:
            pd = PdServices(self._resolve_fd, self._crash_from_thread)
            self._runner = LocalRunner(self._work, self._loader, pd, self)
        else:
            self._runner = ProcessRunner(child, self)
        self._domain_handles = config.domain_handles
        self._absent_module = config.absent_module_result
        self._sleep = sleep
        self._on_crash = on_crash
        self._lock = threading.Lock()
        self._handles: dict[int, LoadedSkel] = {}
        self._issued = 0
        self._exited = False
        self._reason: type[ProcessExitedError] | type[SubsystemDownError] | None = None
        self.crashed = False
        """The process ended because its child died on its own (or by crash())."""
        self._gone = threading.Event()
        """Set when the process ends: work still running for it stops (AEE_EBADSTATE)."""
        self._ending = _Ending(self)

    @property
    def exited(self) -> bool:
        with self._lock:
            return self._exited

    @property
    def handle_count(self) -> int:
        with self._lock:
            return len(self._handles)

    @property
    def child(self) -> PdChild | None:
        """The PD child process (process isolation), killed or not."""
        return self._runner.child

    # -- what a child asks of the thread waiting for its call (pd_host.CallServices) ----

    def work(self, seconds: float) -> None:
        """SkelCall.work of skel code in the child: the channel's shared compute."""
        self._work(seconds)

    @property
    def metered(self) -> bool:
        """The channel models its shared compute: skel code's host work is charged."""
        return self._compute is not None and self._compute.modelled

    def work_begin(self, matrix: bool, started: float | None = None) -> object:
        assert self._compute is not None  # only asked when metered
        return self._compute.begin(matrix=matrix, started=started)

    def work_end(self, job: object, seconds: float) -> None:
        assert self._compute is not None
        assert isinstance(job, Job)
        self._compute.end(job, seconds, self._ending)

    def work_drop(self, job: object) -> None:
        assert self._compute is not None
        assert isinstance(job, Job)
        self._compute.drop(job)

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """host_files.read_host_file of skel code in the child: reverse RPC, as the loader."""
        return self._loader.read_host_file(name, limit=limit)

    def _instantiate(self, name: str, factory: SkelFactory, method_offset: int) -> SkelInstance:
        return self._runner.instantiate(name, factory, method_offset)

    # -- memory the DSP reaches ------------------------------------------------------------

    def map_buffer(
        self,
        fd: int,
        buffer: DmaBuf,
        mapping: mmap.mmap,
        offset: int,
        length: int,
        flags: int,
    ) -> int:
        """MEM_MAP: record it (taking ``mapping``) and tell the child; the DSP address.
        AddressSpaceFullError leaves ``mapping`` the caller's."""
        entry = self.memory.add_map(fd, buffer, mapping, offset, length, flags)
        self._runner.bind(entry, fd)
        return entry.vaddr

    def map_alias(self, fd: int, target: MemMapping, offset: int, length: int) -> int:
        """MEM_MAP that an old kernel resolved by fd number to ``target``."""
        entry = self.memory.add_alias(fd, target, offset, length)
        self._runner.bind(entry, fd)
        return entry.vaddr

    def unmap(self, entry: MemMapping) -> bool:
        """MEM_UNMAP of ``entry``; False when another thread already did."""
        if not self.memory.remove_map(entry):
            return False
        self._runner.unbind(entry)
        return True

    def _resolve_fd(self, fd: int) -> FdMemory | None:
        """PdServices.map_fd with thread isolation: the newest MEM_MAP through ``fd``,
        pinned in the process's records."""
        entry = self.memory.pin_by_fd(fd)
        if entry is None:
            return None

        def release() -> None:
            self.memory.unpin(entry)

        return FdMemory(fd, memoryview(entry.mapping), entry.offset, entry.length, release)

    def _crash_from_thread(self, text: str) -> None:
        """A thread of the PD's own raised (thread isolation): the process crashes."""
        self.crash()

    def forget_memory(self, memory_ids: Sequence[int]) -> None:
        """The driver stopped caching these buffers' DSP mappings."""
        self._runner.drop(memory_ids)

    # -- invocation ----------------------------------------------------------

    def invoke(self, call: DspCall, *, crash: bool = False) -> int:
        """Run ``call``; the AEE result. SubsystemDownError when the DSP restarts meanwhile.

        ``crash`` (fault injection): the process crashes during the call; with a child
        and a remote handle, the child dies in the middle of the method."""
        if self.exited:
            return AEE.EBADSTATE.dsp
        try:
            if crash and (self._runner.child is None or call.handle <= LAST_STATIC_HANDLE):
                self.crash()
                return AEE.EBADSTATE.dsp
            return self._dispatch(call, crash)
        except _BadCallError:
            return AEE.EBADPARM.dsp
        except ProcessExitedError:
            return AEE.EBADSTATE.dsp

    def _dispatch(self, call: DspCall, crash: bool = False) -> int:
        handle = call.handle
        if handle in DOMAIN_HANDLES and not self._domain_handles:
            return self._absent_module
        if handle in REMOTECTL_METHODS:
            return self._remotectl(call, *REMOTECTL_METHODS[handle])
        if handle in LISTENER_METHODS:
            return self._listener(call, *LISTENER_METHODS[handle])
        if handle == CURRENT_PROCESS_HANDLE:
            return self._current_process(call)
        if handle <= LAST_STATIC_HANDLE:
            return self._absent_module
        with self._lock:
            loaded = self._handles.get(handle)
        if loaded is None:
            return AEE.EINVHANDLE.dsp
        try:
            return loaded.instance.invoke(call, crash=crash)
        except PdGoneError:
            raise self._child_gone() from None
        except SkelFaultError:  # thread isolation: a child would have died of it
            self.crash()
            raise ProcessExitedError from None

    def _work(self, seconds: float) -> None:
        self._sleep(seconds, self._ending)

    # -- remotectl -----------------------------------------------------------

    def _remotectl(self, call: DspCall, open_method: idl.Method, close: idl.Method) -> int:
        method = decode_scalars(call.sc).method
        if method == open_method.index:
            return self._remotectl_open(call, open_method)
        if method == close.index:
            return self._remotectl_close(call, close)
        return AEE.EUNSUPPORTED.dsp

    def _remotectl_open(self, call: DspCall, method: idl.Method) -> int:
        values = _unpack(call, method)
        uri = values.text("name")
        try:
            loaded = self._loader.load(uri)
        except PdGoneError:
            raise self._child_gone() from None
        except LoadError as exc:
            _reply(call, method, {"handle": 0, "nErr": _s32(exc.code)})
            _write_text(values.view("dlerror"), exc.message)
            return 0
        refusal = 0
        with self._lock:
            if self._exited:
                refusal = AEE.EBADSTATE.dsp
            elif self._issued >= MAX_HANDLES_PER_PROCESS:
                refusal = AEE.EOUTOFHANDLES.dsp
            else:
                self._issued += 1
                handle = (self.info.client_id << 24) | (self._issued << 4)
                self._handles[handle] = loaded
        if refusal:
            loaded.unload()  # outside the lock: it may call the host (heap shrink)
            return refusal
        _reply(call, method, {"handle": handle, "nErr": 0})
        return 0

    def _remotectl_close(self, call: DspCall, method: idl.Method) -> int:
        handle = _unpack(call, method).integer("handle")
        with self._lock:
            loaded = self._handles.pop(handle, None)
        if loaded is None:
            return AEE.EINVHANDLE.dsp
        loaded.unload()
        _reply(call, method, {"nErr": 0})
        return 0

    # -- the listener (reverse RPC) -----------------------------------------

    def _listener(
        self, call: DspCall, init2: idl.Method, next2: idl.Method, get_in_bufs2: idl.Method
    ) -> int:
        method = decode_scalars(call.sc).method
        if method == init2.index:
            _unpack(call, init2)
            self.reverse.init_listener()
            return 0
        if method == next2.index:
            return self._next2(call, next2)
        if method == get_in_bufs2.index:
            return self._get_in_bufs2(call, get_in_bufs2)
        return AEE.EUNSUPPORTED.dsp

    def _next2(self, call: DspCall, method: idl.Method) -> int:
        values = _unpack(call, method)
        bufs = values.view("bufs")
        try:
            request = self.reverse.next(
                values.integer("prevCtx"),
                values.integer("prevResult") & 0xFFFFFFFF,
                bytes(values.view("prevbufs")),
                len(bufs),
            )
        except ListenerInterruptedError:
            return int(AEE.EINTERRUPTED)
        except ListenerNotReadyError:
            return AEE.ENOTINITIALIZED.dsp
        reply = {"ctx": request.ctx, "handle": request.handle, "sc": request.sc}
        _reply(call, method, {**reply, "bufsLenReq": request.needed})
        bufs[: len(request.data)] = request.data
        return 0

    def _get_in_bufs2(self, call: DspCall, method: idl.Method) -> int:
        values = _unpack(call, method)
        bufs = values.view("bufs")
        try:
            data, needed = self.reverse.get_in_bufs(
                values.integer("ctx"), values.integer("offset"), len(bufs)
            )
        except BadReverseMessageError:
            return AEE.EBADPARM.dsp
        _reply(call, method, {"bufsLenReq": needed})
        bufs[: len(data)] = data
        return 0

    # -- adsp_current_process1 -------------------------------------------------

    def _current_process(self, call: DspCall) -> int:
        if decode_scalars(call.sc).method != EXIT.index:
            return AEE.EUNSUPPORTED.dsp
        _unpack(call, EXIT)
        self._end(ProcessExitedError)
        return 0

    # -- lifecycle -----------------------------------------------------------

    def _end(self, reason: type[ProcessExitedError] | type[SubsystemDownError]) -> None:
        """The process stops existing on the DSP: handles go, waiters wake up, its child
        is killed (the calls waiting on it return at once)."""
        with self._lock:
            self._exited = True
            if self._reason is None:
                self._reason = reason
            first = self._reason
            handles, self._handles = self._handles, {}
        self._runner.end(first)
        self.heap.close()  # the kernel drops heap grants with the fd: nothing to give back
        self._gone.set()
        self.reverse.shutdown(reason)
        for loaded in handles.values():
            loaded.unload()

    def _child_gone(self) -> ProcessExitedError | SubsystemDownError:
        """What a call answers when the child ended under it: the reason the process
        ended, or (nobody ended it) a crash, which ends the process now."""
        with self._lock:
            reason = self._reason
        if reason is None:
            self.crash()
            return ProcessExitedError()
        return reason()

    def crash(self) -> None:
        """The process crashes (its child dies, or died): like an exit, and reported."""
        with self._lock:
            if self._exited or self.crashed:
                return
            self.crashed = True
        child = self._runner.child
        log.warning(
            "DSP process crashed",
            extra={"client_id": self.info.client_id, "pid": child.pid if child else None},
        )
        self._end(ProcessExitedError)
        if self._on_crash is not None:
            self._on_crash(self)

    def check_child(self) -> bool:
        """True while the process's child lives (or it has none); a child found dead on
        its own makes the process crash now."""
        child = self._runner.child
        if child is None or self.exited:
            return child is None or child.alive
        if child.alive:
            return True
        self.crash()
        return False

    def end(self) -> None:
        """The process ends as by an exit (the driver's shutdown)."""
        self._end(ProcessExitedError)

    def channel_down(self) -> None:
        """Subsystem restart: the DSP side is gone; kernel-side mappings stay until close."""
        self._end(SubsystemDownError)

    def terminate(self) -> None:
        """close() of the fd (the kernel's INIT_RELEASE): everything goes."""
        self._end(ProcessExitedError)
        self.memory.release_all()

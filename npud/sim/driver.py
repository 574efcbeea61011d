"""EmulatedDriver: the FastRPC kernel driver and the CDSP, behind the Driver seam.

Implements ``npud.fastrpc.kernel.driver.Driver`` (open/close/ioctl/mmap) for the two
CDSP nodes. Requests are decoded from the raw bytes of the ioctl argument with
the emulator's own layout (:mod:`npud.sim.layout`) and answered the way
``drivers/misc/fastrpc.c`` does: same errnos, ENOTTY for any other command
word, DSP result codes as return values. docs/emulator.md lists every rule and
every place where the emulator had to choose. This module keeps the fd table,
the DSP's life, INVOKE and the statistics; the other commands have modules of
their own, where their constants live too (:mod:`npud.sim.memory_ioctls`,
:mod:`npud.sim.init_ioctls`, :mod:`npud.sim.dsp_info_ioctl`, :mod:`npud.sim.heap_device`).

It also emulates the system DMA-BUF heap, ``/dev/dma_heap/system``
(:mod:`npud.sim.dma_heap`), where libcdsprpc's rpcmem allocates.

Threads: every call runs on the caller's thread; the emulator starts none in
npud's process. With ``SimConfig.pd_isolation="process"`` (the default) each
DSP process's skels run in a child process of its own, forked by a zygote
(:mod:`npud.sim.pd_host`, :mod:`npud.sim.zygote`); those processes have
threads of their own. :meth:`EmulatedDriver.shutdown` ends them (garbage
collection of the driver does too).
Locks: the driver lock guards the fd table, the channels and their sessions;
each DSP process has its own locks (handles, mappings, reverse-RPC queue).
Order: driver lock -> fault injector lock; no process lock is taken while the
driver lock is held, except to read a process's counters.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final

from npu_protocol.aee import AEE
from npud.sim import dma_heap, layout
from npud.sim.channel import FASTRPC_CTX_IDS, Channel
from npud.sim.config import SimConfig
from npud.sim.device_file import DeviceFile, PendingCall
from npud.sim.dmabuf import DmaBufRegistry
from npud.sim.dsp_info_ioctl import DspInfoIoctl
from npud.sim.errors import SubsystemDownError, fault
from npud.sim.fault_control import DriverFaultControl
from npud.sim.faults import FaultInjector
from npud.sim.heap_device import HeapDevice
from npud.sim.init_ioctls import InitIoctls
from npud.sim.invoke import InvokeArguments
from npud.sim.ioctl_args import IoctlBuffer, arg_view, ioctl_result
from npud.sim.mappings import MappingTable
from npud.sim.memory_ioctls import MemoryIoctls
from npud.sim.pd import DspCall
from npud.sim.pd_host import PdSpawnError
from npud.sim.pd_spawner import PdSpawner
from npud.sim.process import (
    LAST_STATIC_HANDLE,
    DspProcess,
    ProcessInfo,
    ProcessKind,
    is_hexagon_elf,
)
from npud.sim.statistics import SimStatistics
from npud.sim.usermem import UserMemory
from npud.sim.vmas import VmaFinder

__all__ = ["INIT_HANDLE", "NODES", "NON_SECURE_NODE", "SECURE_NODE", "EmulatedDriver"]

SECURE_NODE: Final = "/dev/fastrpc-cdsp-secure"
NON_SECURE_NODE: Final = "/dev/fastrpc-cdsp"
NODES: Final = {SECURE_NODE: True, NON_SECURE_NODE: False}  # path -> secure flavour

INIT_HANDLE: Final = 1  # the kernel's own: EPERM from userspace

log = logging.getLogger(__name__)


class _Reports(threading.local):
    """Per thread: the DSP time the DSP reported with the thread's last INVOKE."""

    dsp_seconds: float | None = None


class EmulatedDriver:
    """The emulated kernel driver and DSP; see the module docstring and docs/emulator.md."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self._lock = threading.Lock()
        self._usermem = UserMemory()
        self._dmabufs = DmaBufRegistry(self.config.max_dma_buf_size)
        self._processes_in_children = self.config.pd_isolation == "process"
        self._mappings = MappingTable(
            VmaFinder(procmap_query=self.config.procmap_query),
            enabled=self.config.address_cache,
            on_retire=self._retired if self._processes_in_children else None,
        )
        self._memory = MemoryIoctls(self.config, self._dmabufs, self._require_alive)
        self._init = InitIoctls(
            self.config,
            self._dmabufs,
            self._mappings,
            self._usermem,
            self._require_alive,
            self._create_process,
        )
        self._dsp_info = DspInfoIoctl(self.config, self._lock)
        self._pd = PdSpawner(self.config)
        self._finalizer = weakref.finalize(self, self._pd.close)
        if self._processes_in_children:
            self._pd.start()  # the zygote imports in the background meanwhile
        self._crashes = 0
        self._devices: dict[int, DeviceFile] = {}  # open device fds
        self._live: set[DeviceFile] = set()  # open, or closed with a release pending
        self._generation = 1
        self._channel: Channel | None = Channel(
            self._generation, self.config.sessions, self.config.dsp_units, self.config.hmx_units
        )
        self._down_until: float | None = None
        self._restarts = 0
        self._invokes_in_flight = 0
        self._calls: set[PendingCall] = set()  # INVOKEs waiting for the DSP, every channel
        self._suspends = 0
        self._reports = _Reports()
        self._lost_mmaps = 0
        self._lost_mmap_bytes = 0
        self.faults = FaultInjector(
            restart=self._subsystem_restart,
            boot=self._boot,
            interrupt_listeners=self._interrupt_listeners,
            sessions=self.config.sessions,
            suspend=self._suspend,
        )
        self._heap = HeapDevice(self.config, self._dmabufs, self.faults, self._lock)
        self._handlers: dict[int, Callable[[DeviceFile, IoctlBuffer], int]] = {
            layout.ALLOC_DMA_BUFF: self._memory.alloc_dma_buff,
            layout.INVOKE: self._invoke,
            layout.INIT_ATTACH: self._init_attach,
            layout.INIT_CREATE: self._init.init_create,
            layout.MMAP: self._memory.mmap,
            layout.MUNMAP: self._memory.munmap,
            layout.INIT_ATTACH_SNS: self._init.init_attach_sns,
            layout.INIT_CREATE_STATIC: self._init.init_create_static,
            layout.MEM_MAP: self._memory.mem_map,
            layout.MEM_UNMAP: self._memory.mem_unmap,
            layout.GET_DSP_INFO: self._dsp_info.get_dsp_info,
        }

    # -- the Driver protocol -------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        """A new fd bound to a free session of the current channel; the caller owns it.

        ENOENT for any other path or while the DSP is down, EBUSY when no
        session is free. ``flags`` are accepted and ignored, as by the misc device.
        ``/dev/dma_heap/system`` opens the DMA-BUF heap (ENOENT with
        ``SimConfig.dma_heap=False``), whatever the DSP does.
        """
        if path == dma_heap.SYSTEM_HEAP_NODE:
            return self._heap.open(path)
        secure = NODES.get(path)
        if secure is None:
            raise fault(errno.ENOENT, f"{path}: not a node of the emulated DSP")
        with self._lock:
            channel = self._current_channel()
            if channel is None:
                raise fault(errno.ENOENT, f"{path}: the DSP is down (subsystem restart)")
            session = channel.claim_session(self.faults.session_limit)
            if session is None:
                raise fault(errno.EBUSY, f"{path}: no free compute session")
            try:
                fd = os.eventfd(0, os.EFD_CLOEXEC)
            except BaseException:
                channel.release_session(session)
                raise
            device = DeviceFile(fd, path, secure, channel, session)
            self._devices[fd] = device
            self._live.add(device)
        return fd

    def close(self, fd: int) -> None:
        """Close ``fd``. A device fd releases its session and DSP process.

        Like the kernel, the release waits for ioctls still running on the fd
        in other threads: it happens when the last of them returns.
        """
        with self._lock:
            self._heap.fds.discard(fd)
            device = self._devices.pop(fd, None)
            release = device is not None and self._mark_closed(device)
        os.close(fd)
        if device is not None and release:
            self._release(device)

    def ioctl(self, fd: int, request: int, arg: IoctlBuffer) -> int:
        """Run ``request`` on device ``fd``; the DSP's result, or OSError with the errno.

        ENOTTY for fds that are not emulated device fds and for unknown commands.
        A DMA-BUF heap fd answers the heap's own command (:mod:`npud.sim.dma_heap`).
        """
        with self._lock:
            heap = fd in self._heap.fds
        if heap:
            return self._heap.ioctl(request, arg)
        device = self._enter(fd)
        try:
            handler = self._handlers.get(request)
            if handler is None:
                raise fault(errno.ENOTTY, f"{request:#010x} is not a FastRPC command")
            injected = self.faults.take_ioctl_fault(request)
            if injected is not None and not injected.after:
                raise fault(injected.err, "injected")
            result = handler(device, arg)
            if injected is not None:
                raise fault(injected.err, "injected after the call took effect")
            return result
        finally:
            self._leave(device)

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        """A shared read-write mapping of ``fd``; the caller owns it.

        A device fd is ENODEV (the misc device has no mmap). An emulator dma-buf
        maps like the kernel's: whole pages at page-aligned offsets, none past
        the buffer's last full page (EINVAL).
        """
        with self._lock:
            if fd in self._devices:
                raise fault(errno.ENODEV, "the FastRPC device cannot be mapped")
            if fd in self._heap.fds:
                raise fault(errno.ENODEV, "the DMA-BUF heap device cannot be mapped")
        buffer = self._dmabufs.identify(fd)
        if buffer is not None:
            DmaBufRegistry.check_user_mmap(buffer, length, offset)
            return self._mappings.map(fd, buffer, length, offset)
        return mmap.mmap(
            fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
        )

    def suspends(self) -> int:
        """Suspends so far: ``faults.suspend()`` and ``faults.suspend_next_invoke``."""
        with self._lock:
            return self._suspends

    # -- observation ---------------------------------------------------------

    def statistics(self) -> SimStatistics:
        """A snapshot. PD children found dead on their own are crashes, noticed here."""
        with self._lock:
            live = list(self._live)
            channel = self._channel
            open_fds = len(self._devices)
            in_flight = self._invokes_in_flight
            restarts = self._restarts
            sessions = channel.sessions_in_use if channel is not None else 0
            interrupted = len(channel.interrupted_mmaps) if channel is not None else 0
            contexts = channel.contexts if channel is not None else 0
            kept = sum(
                d.interrupted_contexts for d in live if channel is not None and d.channel is channel
            )
            suspends, lost, lost_bytes = self._suspends, self._lost_mmaps, self._lost_mmap_bytes
            dead = {device: not device.channel.alive for device in live}
        processes = [(d.process, dead[d]) for d in live if d.process is not None]
        children = sum(1 for p, _ in processes if p.child is not None and p.check_child())
        with self._lock:
            crashes, heaps, heap_allocations = (
                self._crashes,
                len(self._heap.fds),
                self._heap.allocations,
            )
        user_mappings, dsp_mappings = self._mappings.counts()
        return SimStatistics(
            device_fds_open=open_fds,
            releases_pending=sum(1 for device in live if device.closed),
            sessions_in_use=sessions,
            session_limit=self.faults.session_limit,
            dsp_processes=sum(1 for p, down in processes if not down and not p.exited),
            remote_handles_open=sum(p.handle_count for p, _ in processes),
            mem_maps=sum(p.memory.map_count for p, _ in processes),
            mmap_buffers=sum(p.memory.heap_count for p, _ in processes),
            dma_bufs_allocated=self._dmabufs.allocated,
            dma_bufs_alive=self._dmabufs.count_alive(),
            dma_bufs_registered=self._dmabufs.registered,
            user_mappings_cached=user_mappings,
            dsp_mappings_cached=dsp_mappings,
            invokes_in_flight=in_flight,
            reverse_requests_pending=sum(p.reverse.pending for p, _ in processes),
            restarts=restarts,
            dsp_up=channel is not None,
            pd_children=children,
            pd_crashes=crashes,
            dma_heap_fds_open=heaps,
            dma_heap_allocations=heap_allocations,
            interrupted_mmaps=interrupted,
            contexts_in_use=contexts,
            interrupted_contexts=kept,
            suspends=suspends,
            lost_mmaps=lost,
            lost_mmap_bytes=lost_bytes,
        )

    def pd_pid(self, fd: int) -> int | None:
        """The pid of the child process that runs the skels of device ``fd``'s DSP process
        (process isolation; None without a process, a child, or once it ended)."""
        with self._lock:
            device = self._devices.get(fd)
        if device is None:
            raise fault(errno.EBADF, f"fd {fd} is not an open emulated device")
        process = device.process
        child = process.child if process is not None else None
        if process is None or child is None or process.exited or not child.alive:
            return None
        return child.pid

    def dsp_report(self) -> float | None:
        """The DSP time the emulated DSP reported with this thread's last INVOKE: a
        dspqueue ``wait_signal``'s answer carries the time of the work its process did
        for the packets answered (:class:`npud.sim.skels_dspqueue.Signal`); None for
        any other call, as always on the kernel's driver, and for every call with
        ``SimConfig.report_dsp_time`` off (the device's way, for measuring npud's
        estimate)."""
        if not self.config.report_dsp_time:
            return None
        return self._reports.dsp_seconds

    def fault_control(self) -> DriverFaultControl:
        """The emulated DSP's failures on demand (``debug``; the Driver seam's
        ``FaultControl``, which npud.sim describes with its own types)."""
        return DriverFaultControl(self.faults, self.crash_process)

    def crash_process(self, fd: int) -> bool:
        """The DSP process bound to device ``fd`` crashes now (its child dies): calls
        waiting on it and every later invoke answer AEE_EBADSTATE, its listener stops.
        False when ``fd`` has no live process."""
        with self._lock:
            device = self._devices.get(fd)
        process = device.process if device is not None else None
        if process is None or process.exited:
            return False
        process.crash()
        return True

    def shutdown(self) -> None:
        """End every DSP process of this driver (as by an exit: their calls answer
        AEE_EBADSTATE), kill their PD children and give the zygote back. Open fds stay
        open (their owners close them). The driver remains usable: a later INIT starts
        what it needs again. Garbage collection of the driver does the same."""
        with self._lock:
            processes = [d.process for d in self._live if d.process is not None]
        for process in processes:
            process.end()
        self._pd.close()

    def __enter__(self) -> EmulatedDriver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.shutdown()

    def process_info(self, fd: int) -> ProcessInfo | None:
        """What INIT_CREATE/INIT_ATTACH recorded for device ``fd`` (None before either)."""
        with self._lock:
            device = self._devices.get(fd)
        if device is None:
            raise fault(errno.EBADF, f"fd {fd} is not an open emulated device")
        return device.process.info if device.process is not None else None

    # -- fd bookkeeping ------------------------------------------------------

    def _enter(self, fd: int) -> DeviceFile:
        with self._lock:
            device = self._devices.get(fd)
            if device is not None:
                device.active_ioctls += 1
                return device
        os.fstat(fd)  # EBADF for a number that is not an fd at all
        raise fault(errno.ENOTTY, f"fd {fd} is not an emulated FastRPC device")

    def _leave(self, device: DeviceFile) -> None:
        with self._lock:
            device.active_ioctls -= 1
            release = device.closed and self._mark_closed(device)
        if release:
            self._release(device)

    @staticmethod
    def _mark_closed(device: DeviceFile) -> bool:
        """Under the lock: True when the caller must now release ``device``."""
        device.closed = True
        if device.active_ioctls or device.released:
            return False
        device.released = True
        return True

    def _release(self, device: DeviceFile) -> None:
        """The kernel's fastrpc_device_release: tear the DSP process down, free the session."""
        if device.process is not None:
            device.process.terminate()
        with self._lock:
            # fastrpc_device_release puts every context still on the fd's pending list:
            # the interrupted calls' context ids are free again only now.
            device.channel.release_contexts(device.interrupted_contexts)
            device.interrupted_contexts = 0
            device.channel.release_session(device.session)
            self._live.discard(device)

    # -- the DSP's life ------------------------------------------------------

    def _current_channel(self) -> Channel | None:
        """Under the lock: the channel new opens bind to, booting when ``down_for`` ran out."""
        if (
            self._channel is None
            and self._down_until is not None
            and time.monotonic() >= self._down_until
        ):
            self._boot_locked()
        return self._channel

    def _boot_locked(self) -> None:
        self._generation += 1
        self._channel = Channel(
            self._generation, self.config.sessions, self.config.dsp_units, self.config.hmx_units
        )
        self._down_until = None

    def _boot(self) -> None:
        with self._lock:
            if self._channel is None:
                self._boot_locked()

    def _subsystem_restart(self, down_for: float | None) -> None:
        with self._lock:
            self._down_until = None if down_for is None else time.monotonic() + down_for
            channel = self._channel
            if channel is None:
                return  # already down: only the time until it comes back changes
            self._channel = None
            self._restarts += 1
            # fastrpc_rpmsg_remove only unlinks the interrupted invokes' buffers (list_del,
            # no free): their memory is lost until the machine reboots.
            self._lost_mmaps += len(channel.interrupted_mmaps)
            self._lost_mmap_bytes += sum(b.size for b in channel.interrupted_mmaps)
            channel.interrupted_mmaps.clear()
            channel.kill()
            self._dmabufs.lose_bank(channel.generation)
            processes = [
                d.process for d in self._live if d.channel is channel and d.process is not None
            ]
        for process in processes:
            process.channel_down()

    def _suspend(self) -> None:
        """A system suspend now: the freezer ends the wait of every INVOKE waiting for the
        DSP, on every fd at once (ERESTARTSYS). For each, as mainline does, the context
        stays on the fd's pending list, holding its id until the fd is released; every
        MMAP buffer of the fd moves to the channel's list; and the syscall restarts under
        a new context (none free: the restarted call fails with ENOSPC). The DSP's answer
        reaches the restarted call (docs/emulator.md, Suspend)."""
        with self._lock:
            self._suspends += 1
            devices: set[DeviceFile] = set()
            for call in self._calls:
                channel = call.device.channel
                if not channel.alive:
                    continue
                call.interrupted += 1
                if call.holds_context:
                    call.device.interrupted_contexts += 1
                    call.holds_context = channel.claim_context()
                devices.add(call.device)
        for device in devices:
            self._interrupted(device)

    def _interrupt_listeners(self) -> None:
        with self._lock:
            channel = self._channel
            processes = [
                d.process for d in self._live if d.channel is channel and d.process is not None
            ]
        for process in processes:
            process.reverse.interrupt_listeners()

    def _require_alive(self, device: DeviceFile, operation: str) -> None:
        with self._lock:
            if not device.channel.alive:
                raise fault(errno.EPIPE, f"{operation}: the DSP restarted; reopen the device")

    # -- ioctl handlers ------------------------------------------------------

    def _invoke(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        self._reports.dsp_seconds = None  # nothing reported until this call answers
        view = arg_view(arg, layout.INVOKE_STRUCT.size, writable=False)
        request = layout.InvokeRequest._make(layout.INVOKE_STRUCT.unpack(view))
        scalars = layout.decode_scalars(request.sc)
        size = layout.INVOKE_ARG_STRUCT.size
        raw = self._usermem.read(request.args, scalars.length * size)
        args = [
            layout.InvokeArg._make(layout.INVOKE_ARG_STRUCT.unpack_from(raw, index * size))
            for index in range(scalars.length)
        ]
        while True:
            result = self._invoke_once(device, request, scalars, args)
            if result is not None:
                return ioctl_result(result)
            # ERESTARTSYS under the suspend freezer: the syscall restarts by itself and
            # the kernel sends the call again, under a new context (the DSP runs it twice).

    def _invoke_once(
        self,
        device: DeviceFile,
        request: layout.InvokeRequest,
        scalars: layout.Scalars,
        args: list[layout.InvokeArg],
    ) -> int | None:
        """One pass of the kernel's ``fastrpc_internal_invoke``: the DSP's result, or None
        when a suspend interrupted the wait and the call is to be sent again."""
        channel = device.channel
        with self._lock:
            if not channel.alive:
                raise fault(errno.EPIPE, "INVOKE: the DSP restarted; reopen the device")
            if request.handle == INIT_HANDLE:
                raise fault(errno.EPERM, "INVOKE: handle 1 belongs to the kernel")
            if not channel.claim_context():
                raise fault(errno.ENOSPC, f"INVOKE: {self._no_context_locked(channel)}")
            call_state = PendingCall(device)
            self._calls.add(call_state)
            self._invokes_in_flight += 1
        process = device.process
        in_child = (
            process is not None
            and process.child is not None
            and request.handle > LAST_STATIC_HANDLE
        )
        try:
            with InvokeArguments(
                self._usermem,
                self._dmabufs,
                self._mappings,
                scalars,
                args,
                self.config.max_dma_buf_size,
                alias=self._memory.stale_alias(device),
                for_child=in_child,
                channel=channel.generation,
            ) as arguments:
                inputs, outputs = arguments.prepare()
                call = DspCall(request.handle, request.sc, inputs, outputs, arguments)
                result = self._run_on_dsp(device, call)
                if not channel.alive:
                    raise SubsystemDownError
                with self._lock:
                    restarted_without_context = (
                        call_state.interrupted > 0 and not call_state.holds_context
                    )
                if restarted_without_context:
                    raise fault(
                        errno.ENOSPC,
                        "INVOKE: restarted after a suspend, "
                        + self._no_context_locked_snapshot(channel),
                    )
                if self.faults.take_interrupt(request.handle):
                    # The DSP ran it; the kernel's interruptible wait returned first.
                    self._leak_context(call_state)
                    self._interrupted(device)
                    raise fault(errno.EINTR, "INVOKE: interrupted (injected)")
                if self.faults.take_suspend(request.handle):
                    with self._lock:
                        self._suspends += 1
                    self._leak_context(call_state)
                    self._interrupted(device)
                    return None  # nothing is copied out: the restarted call answers
                arguments.copy_out()
                self._reports.dsp_seconds = call.report.dsp_seconds
        except SubsystemDownError:
            raise fault(errno.EPIPE, "INVOKE: the DSP restarted during the call") from None
        finally:
            with self._lock:
                self._calls.discard(call_state)
                if call_state.holds_context:
                    channel.release_context()
                self._invokes_in_flight -= 1
        return result

    def _leak_context(self, call: PendingCall) -> None:
        """ERESTARTSYS ended ``call``'s wait: its context stays on the fd's pending list
        (mainline frees it only when the fd is released), its id still taken."""
        with self._lock:
            if call.holds_context:
                call.device.interrupted_contexts += 1
                call.holds_context = False

    def _no_context_locked(self, channel: Channel) -> str:
        """Under the lock: why the channel has no context id for one more call."""
        kept = sum(d.interrupted_contexts for d in self._live if d.channel is channel)
        return (
            f"no free context ({FASTRPC_CTX_IDS} per channel: {channel.contexts - kept} calls "
            f"in flight, {kept} interrupted ones kept until their fds close)"
        )

    def _no_context_locked_snapshot(self, channel: Channel) -> str:
        with self._lock:
            return self._no_context_locked(channel)

    def _interrupted(self, device: DeviceFile) -> None:
        """ERESTARTSYS ended a user invoke's wait: as 76e8e4ace1ed does, every MMAP buffer
        of the fd moves to the channel's list, where no MUNMAP of the fd finds it; the
        kernel never frees them (a restart only unlinks them)."""
        process = device.process
        if process is None:
            return
        moved = process.memory.give_up_heap()
        if moved:
            with self._lock:
                device.channel.interrupted_mmaps.extend(moved)

    def _run_on_dsp(self, device: DeviceFile, call: DspCall) -> int:
        process = device.process
        if process is None:
            return AEE.EBADSTATE.dsp  # no INIT_CREATE / INIT_ATTACH yet
        injected = self.faults.take_invoke_failure(call.handle)
        if injected is not None:
            return injected
        if call.handle > LAST_STATIC_HANDLE:
            latency = self.faults.latency
            if latency > 0:
                device.channel.sleep(latency)
        return process.invoke(call, crash=self.faults.take_crash(call.handle))

    def _create_process(
        self, device: DeviceFile, info: ProcessInfo, image: bytes | None = None
    ) -> int:
        with self._lock:
            if not device.channel.alive:
                raise fault(errno.EPIPE, "INIT: the DSP restarted; reopen the device")
            if device.process is not None:
                return AEE.EALREADY.dsp
            if image is not None and not is_hexagon_elf(image):
                return AEE.EBADELF.dsp
        child = None
        if self._processes_in_children:
            try:
                child = self._pd.spawn()  # outside the lock: the zygote may still be starting
            except PdSpawnError as exc:
                log.error("no process for the DSP process", extra={"error": str(exc)})
                return AEE.EFAILED.dsp
        process = DspProcess(
            info,
            self.config,
            device.channel.work,
            child,
            self._crashed,
            compute=device.channel.compute,
        )
        with self._lock:
            if device.channel.alive and device.process is None:
                device.process = process
                return 0
            alive = device.channel.alive
        process.end()  # another thread created one meanwhile, or the DSP restarted
        if not alive:
            raise fault(errno.EPIPE, "INIT: the DSP restarted; reopen the device")
        return AEE.EALREADY.dsp

    def _crashed(self, process: DspProcess) -> None:
        with self._lock:
            self._crashes += 1

    def _retired(self, memory_ids: Sequence[int]) -> None:
        """The address cache closed these DSP mappings: the children drop them too."""
        with self._lock:
            processes = [d.process for d in self._live if d.process is not None]
        for process in processes:
            process.forget_memory(memory_ids)

    def _init_attach(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        return self._create_process(device, ProcessInfo(ProcessKind.ROOT_PD, device.client_id))

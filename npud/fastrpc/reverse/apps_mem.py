"""``apps_mem``: the DSP's heap growth, served like libcdsprpc's apps_mem_imp.c.

A user PD starts with the 2-8 MiB the kernel gives it at INIT_CREATE. A
large skel (the QNN HTP skel, a model library) needs more: the DSP opens
``apps_mem`` through apps_remotectl and calls ``request_map64`` (method 2)
with ``rflags`` ADSP_MMAP_ADD_PAGES (0x1000); the host answers with the MMAP
ioctl (fd -1, vaddrin 0, the size asked), which makes the kernel allocate the
pages and add them to the process, and returns the DSP address. The kernel
keeps the buffer until ``request_unmap64`` (method 3, the MUNMAP ioctl) or
until the session's fd closes; or, once a signal or the suspend freezer
interrupted an invoke on the fd (ERESTARTSYS), until the DSP restarts: the
kernel then moves the fd's buffers to the channel and their MUNMAP is EINVAL
(logged; the grant is dropped, never given back twice).

Served: ``request_map64`` / ``request_unmap64`` and their 32-bit forms
(``request_map`` 0, ``request_unmap`` 1) with rflags ADD_PAGES or
ADSP_MMAP_REMOTE_HEAP_ADDR (8), the two the mainline MMAP ioctl accepts.
libcdsprpc allocates in user space only for an unsigned PD on a kernel
reporting USERSPACE_ALLOCATION_SUPPORT, which the upstream library never
does on these kernels: the kernel allocates. Other rflags (HEAP_ADDR 4,
ADD_PAGES_LLC 0x3000, FASTRPC_ALLOC_HLOS_FD 0x10000) and the methods that
map a host fd the DSP names (share_map 4 .. dma_handle_unmap 7) answer
AEE_EUNSUPPORTED: npud hands the DSP no fds but its own.

The layouts come from ``idl/apps_mem.idl`` through :mod:`npud.idl`, the
description the emulator's DSP side uses too, parsed at the first call the DSP
makes to apps_mem (:func:`apps_mem_idl`): most sessions never grow their heap,
and the daemon's start does not wait for a parse it may never need.
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from npu_protocol import AEE, describe_result
from npud.fastrpc.reverse.reverse_modules import CallDescription, Reply, aee_for_errno, fail

if TYPE_CHECKING:
    from npud import idl

log = logging.getLogger(__name__)

ADSP_MMAP_ADD_PAGES: Final = 0x1000
ADSP_MMAP_REMOTE_HEAP_ADDR: Final = 0x8
SERVED_FLAGS: Final = frozenset({ADSP_MMAP_ADD_PAGES, ADSP_MMAP_REMOTE_HEAP_ADDR})
MAX_GRANT: Final = 1 << 32
"""The DSP's address space is 32-bit: no single request may be larger."""
MAX_GRANTS: Final = 4096

_MAPS: Final = {"request_map": 32, "request_map64": 64}
_UNMAPS: Final = {"request_unmap": 32, "request_unmap64": 64}


@functools.cache
def apps_mem_idl() -> idl.Interface:
    """``idl/apps_mem.idl``, parsed at the first call (then cached)."""
    from npud import idl  # noqa: PLC0415  (lazy: see the module docstring)

    return idl.load("apps_mem")


class HeapMemory(Protocol):
    """The MMAP / MUNMAP ioctls on the session's fd (raise OSError with the errno)."""

    def heap_map(self, size: int, flags: int) -> tuple[int, int]:
        """MMAP: (the DSP's result, the DSP address); OSError on an errno."""
        ...

    def heap_unmap(self, vaddr: int, size: int) -> int:
        """MUNMAP: the DSP's result; OSError on an errno."""
        ...


@dataclass(frozen=True)
class Grant:
    vaddr: int
    size: int
    flags: int


class AppsMemServer:
    """The ``apps_mem`` module of one session; remembers what it mapped, by DSP address."""

    name = "apps_mem"

    def __init__(self, memory: HeapMemory) -> None:
        self._memory = memory
        self._lock = threading.Lock()
        self._grants: dict[int, Grant] = {}

    @property
    def grants(self) -> tuple[Grant, ...]:
        with self._lock:
            return tuple(self._grants.values())

    def invoke(self, method: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply:
        from npud import idl  # noqa: PLC0415  (loaded by apps_mem_idl() below)

        declared = apps_mem_idl().by_index(method)
        if declared is None or declared.sc != sc:
            return fail(AEE.EUNSUPPORTED if declared is None else AEE.EBADPARM)
        outputs = [memoryview(bytearray(cap)) for cap in caps]
        try:
            values = declared.unpack([memoryview(b) for b in inputs], outputs)
        except idl.MarshalError:
            return fail(AEE.EBADPARM)
        if declared.name in _MAPS:
            result = self._map(values, _MAPS[declared.name])
            if isinstance(result, Reply):
                return result
            declared.pack_routs(outputs, {"vapps": 0, "vadsp": result})
            return Reply(0, tuple(bytes(view) for view in outputs))
        if declared.name in _UNMAPS:
            return self._unmap(values, _UNMAPS[declared.name])
        log.warning("apps_mem call not served", extra={"method": declared.name})
        return fail(AEE.EUNSUPPORTED)

    def describe(self, method: int, inputs: list[bytes]) -> CallDescription:
        declared = apps_mem_idl().by_index(method)
        return CallDescription(declared.name if declared else f"method {method}")

    def close(self) -> None:
        """The kernel frees every MMAP buffer when the session's fd closes."""
        with self._lock:
            self._grants.clear()

    def _map(self, values: idl.Values, bits: int) -> int | Reply:
        rflags, length = values.integer("rflags"), values.integer("len")
        if rflags not in SERVED_FLAGS:
            log.warning("apps_mem rflags not served", extra={"rflags": f"0x{rflags:x}"})
            return fail(AEE.EUNSUPPORTED)
        if not 0 < length < MAX_GRANT:
            return fail(AEE.EBADPARM)
        with self._lock:
            if len(self._grants) >= MAX_GRANTS:
                return fail(AEE.ENOMEMORY)
        try:
            rc, vaddr = self._memory.heap_map(length, rflags)
        except OSError as exc:
            log.warning("DSP heap growth failed", extra={"bytes": length, "error": str(exc)})
            return Reply(aee_for_errno(exc.errno))
        if rc != 0:
            log.warning(
                "DSP heap growth refused", extra={"bytes": length, "result": describe_result(rc)}
            )
            return Reply(rc)
        if bits == 32 and vaddr > 0xFFFFFFFF:
            # The 32-bit call cannot carry the address: give the pages back.
            self._give_back(vaddr, length)
            return fail(AEE.EBADPARM)
        with self._lock:
            self._grants[vaddr] = Grant(vaddr, length, rflags)
        log.info("DSP heap grown", extra={"bytes": length, "vaddr": f"0x{vaddr:x}"})
        return vaddr

    def _unmap(self, values: idl.Values, bits: int) -> Reply:
        vaddr, length = values.integer("vadsp"), values.integer("len")
        with self._lock:
            grant = self._grants.get(vaddr)
        if grant is None:
            return fail(AEE.ENOSUCHMAP)
        try:
            # libcdsprpc passes the DSP's length; the kernel wants the exact size.
            rc = self._memory.heap_unmap(vaddr, length)
        except OSError as exc:
            if exc.errno == errno.EINVAL and length == grant.size:
                self._taken_by_kernel(grant)
            return Reply(aee_for_errno(exc.errno))
        if rc != 0:
            return Reply(rc)
        with self._lock:
            self._grants.pop(vaddr, None)
        return Reply(0)

    def _taken_by_kernel(self, grant: Grant) -> None:
        """MUNMAP of a buffer we mapped, with its exact size, was EINVAL: the fd no longer
        has it. Since 6.2 (76e8e4ace1ed has it) an invoke on the fd that a signal or the
        suspend freezer interrupted (ERESTARTSYS) moves every MMAP buffer of the fd to
        the channel, which frees them only when the DSP restarts. The grant is dropped
        here so nothing tries to give it back again; the DSP is told as libcdsprpc
        tells it (AEE_EBADPARM)."""
        with self._lock:
            self._grants.pop(grant.vaddr, None)
        log.warning(
            "DSP heap buffer no longer on this session's fd: a call interrupted by a "
            "suspend or a signal (ERESTARTSYS) made the kernel keep it until the DSP restarts",
            extra={"bytes": grant.size, "vaddr": f"0x{grant.vaddr:x}"},
        )

    def _give_back(self, vaddr: int, length: int) -> None:
        try:
            self._memory.heap_unmap(vaddr, length)
        except OSError as exc:
            log.warning("giving back heap pages failed", extra={"error": str(exc)})

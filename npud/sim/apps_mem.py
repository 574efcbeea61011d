"""The simulated user PD's heap, grown through the host's ``apps_mem`` like the real one.

The kernel hands a new user PD one block of memory at INIT_CREATE (2-8 MiB,
``SimConfig.heap_for``). When what the process loads does not fit, the DSP
asks the host for more: ``apps_mem.request_map64`` (reverse RPC, method 2)
with ``rflags`` ADSP_MMAP_ADD_PAGES (0x1000), which libcdsprpc serves with the
MMAP ioctl; the DSP address it returns becomes heap. When a grant is no
longer needed the heap gives it back with ``request_unmap64`` (method 3,
served with MUNMAP), newest grant first.

The layouts come from ``idl/apps_mem.idl`` through :mod:`npud.idl`, the same
description the host side (``npud.fastrpc.reverse.apps_mem``) serves.

What counts as heap is the emulator's choice (docs/emulator.md): a loaded
library's bytes, for as long as its handle is open, and a file a skel
streams from the host (apps_std ``fread``), while it is being read. Growth
comes in whole MiB.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import TYPE_CHECKING, Final

from npu_protocol.aee import AEE, describe_result
from npud.sim.errors import ProcessExitedError, SubsystemDownError
from npud.sim.host_calls import HostCallError, HostChannel

if TYPE_CHECKING:
    from npud import idl

log = logging.getLogger(__name__)

APPS_MEM_MODULE: Final = "apps_mem"
ADSP_MMAP_ADD_PAGES: Final = 0x1000
DEFAULT_HEAP_ID: Final = -1  # RPCMEM_DEFAULT_HEAP
GROWTH_GRANULE: Final = 1024 * 1024


@functools.cache
def _apps_mem_idl() -> idl.Interface:
    """``idl/apps_mem.idl``, parsed when a heap first grows (then cached)."""
    from npud import idl  # noqa: PLC0415  (most processes never grow their heap)

    return idl.load("apps_mem")


def _apps_mem_method(name: str) -> idl.Method:
    return _apps_mem_idl().method(name)


class HeapExhaustedError(Exception):
    """The heap cannot hold what was asked and the host did not grow it: AEE_ENOMEMORY."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = AEE.ENOMEMORY.dsp
        self.message = message


@dataclasses.dataclass(frozen=True)
class HeapGrant:
    """Memory the host added to the heap: its DSP address and size."""

    vaddr: int
    size: int


class HeapReservation:
    """Bytes held on the heap; :meth:`release` gives them back (once)."""

    def __init__(self, heap: DspHeap, size: int) -> None:
        self._heap = heap
        self.size = size
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._heap._give_back(self.size)

    def __enter__(self) -> HeapReservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class DspHeap:
    """The heap of one simulated DSP process. Thread-safe; growth runs on the caller's thread."""

    def __init__(self, initial: int, host: HostChannel) -> None:
        self.initial = initial
        self._host = host
        self._lock = threading.Lock()
        self._used = 0
        self._grants: list[HeapGrant] = []
        self._closed = False

    @property
    def capacity(self) -> int:
        with self._lock:
            return self.initial + sum(grant.size for grant in self._grants)

    @property
    def used(self) -> int:
        with self._lock:
            return self._used

    @property
    def grants(self) -> tuple[HeapGrant, ...]:
        with self._lock:
            return tuple(self._grants)

    def reserve(self, size: int, what: str) -> HeapReservation:
        """Hold ``size`` bytes, growing the heap through the host when they do not fit.

        HeapExhaustedError when the host refuses (or cannot be reached);
        SubsystemDownError / ProcessExitedError pass through.
        """
        with self._lock:
            missing = self._used + size - self._capacity_locked()
            if missing > 0:
                self._grow_locked(missing, what)
            self._used += size
        return HeapReservation(self, size)

    def close(self) -> None:
        """The process ended: the kernel drops the grants with the fd; no more calls."""
        with self._lock:
            self._closed = True

    # -- internals -----------------------------------------------------------

    def _capacity_locked(self) -> int:
        return self.initial + sum(grant.size for grant in self._grants)

    def _grow_locked(self, missing: int, what: str) -> None:
        size = (missing + GROWTH_GRANULE - 1) // GROWTH_GRANULE * GROWTH_GRANULE
        request_map64 = _apps_mem_method("request_map64")
        call = request_map64.encode(
            heapid=DEFAULT_HEAP_ID, ion_flags=0, rflags=ADSP_MMAP_ADD_PAGES, vin=0, len=size
        )
        try:
            handle = self._host.module(APPS_MEM_MODULE)
            reply = self._host.call(handle, call.sc, _inline(call.inputs), _caps(call.outputs))
        except HostCallError as exc:
            raise HeapExhaustedError(f"{what}: the heap cannot grow: {exc}") from None
        if reply.result:
            raise HeapExhaustedError(
                f"{what}: the host refused {size} more bytes of heap"
                f" (apps_mem request_map64: {describe_result(reply.result)})"
            )
        values = request_map64.decode(reply.outputs)
        vadsp = values["vadsp"]
        assert isinstance(vadsp, int)
        self._grants.append(HeapGrant(vadsp, size))
        log.info("heap grown", extra={"bytes": size, "vaddr": f"0x{vadsp:x}", "for": what})

    def _give_back(self, size: int) -> None:
        with self._lock:
            self._used -= size
            while not self._closed and self._grants:
                last = self._grants[-1]
                if self._used > self._capacity_locked() - last.size:
                    break
                if not self._unmap_locked(last):
                    break
                self._grants.pop()

    def _unmap_locked(self, grant: HeapGrant) -> bool:
        call = _apps_mem_method("request_unmap64").encode(vadsp=grant.vaddr, len=grant.size)
        try:
            handle = self._host.module(APPS_MEM_MODULE)
            reply = self._host.call(handle, call.sc, _inline(call.inputs), _caps(call.outputs))
        except (HostCallError, ProcessExitedError, SubsystemDownError):
            return False
        if reply.result:
            log.warning(
                "heap shrink refused",
                extra={"vaddr": f"0x{grant.vaddr:x}", "result": describe_result(reply.result)},
            )
            return False
        return True


def _inline(inputs: tuple[object, ...]) -> list[bytes]:
    out: list[bytes] = []
    for item in inputs:
        assert isinstance(item, bytes)
        out.append(item)
    return out


def _caps(outputs: tuple[object, ...]) -> list[int]:
    out: list[int] = []
    for item in outputs:
        assert isinstance(item, int)
        out.append(item)
    return out

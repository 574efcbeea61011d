"""DSP mappings: MEM_MAP and MEM_UNMAP of DMA-BUFs into the session's DSP process, and
the stale mappings a failed MEM_UNMAP leaves (their fds stay open until close)."""

from __future__ import annotations

import threading
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session._device import Device
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log

FASTRPC_MAP_FD_EXTENDED: Final = 17
FASTRPC_MAP_FD_DELAYED_EXTENDED: Final = 18
"""The Hexagon SDK's libcdsprpc's 64-bit DMA variants of FD and FD_DELAYED (llama.cpp
maps its weights with 18 on DSPs newer than v79); qualcomm/fastrpc's header stops at 16."""

MAP_FLAGS: Final = frozenset(
    {abi.FASTRPC_MAP_STATIC} | set(range(abi.FASTRPC_MAP_FD, FASTRPC_MAP_FD_DELAYED_EXTENDED + 1))
)
"""What a client's map may ask the DSP for: every enum fastrpc_map_flags value
libcdsprpc's fastrpc_mmap passes on to the kernel (all below 19 but 1, RESERVED; the
reserved 4..15 among them, which the DSP answers). The kernel hands the flags to the
DSP unchanged; whatever the DSP refuses is MMAP_FAILED with its result."""


class Mappings:
    """Which buffers are mapped into the DSP process, and at which DSP address; the
    stale ones (a failed MEM_UNMAP of a buffer let go of) until the session closes."""

    def __init__(self, device: Device, life: Life) -> None:
        self._device = device
        self._life = life
        self._lock = threading.Lock()
        self._mapped: dict[DmaBuffer, int] = {}  # every buffer mapped here -> DSP address
        self._stale: set[DmaBuffer] = set()  # freed, MEM_UNMAP failed: mapped until close

    def map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        """MEM_MAP ``buffer`` with ``flags`` (checked by the caller); idempotent.
        Returns the DSP address."""
        self._life.check_usable()
        self._life.require_process()
        check_bank(buffer)
        with buffer.lock:
            if buffer.released or buffer.release_pending:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            address = self.address_of(buffer)
            if address is not None:
                return address
            req = whole_buffer_map(buffer, flags)
            rc = self._device.ioctl(abi.FASTRPC_IOCTL_MEM_MAP, req)
            if rc != 0:
                raise RpcError(ErrorCode.MMAP_FAILED, code=rc)
            address = int(req.vaddrout)
            self.add(buffer, address)
            return address

    def add(self, buffer: DmaBuffer, address: int) -> None:
        """Count a mapping made (MEM_MAP succeeded at ``address``); the caller holds
        ``buffer.lock``."""
        buffer.add_mapping()
        with self._lock:
            self._mapped[buffer] = address

    def address_of(self, buffer: DmaBuffer) -> int | None:
        """Where ``buffer`` is mapped in this session's DSP process, or None."""
        with self._lock:
            return self._mapped.get(buffer)

    def unmap(self, buffer: DmaBuffer) -> None:
        """Undo :meth:`map`; a buffer not mapped here is left as it is. When MEM_UNMAP
        fails the buffer stays mapped (and usable); a retry may succeed."""
        self._life.check_usable()
        due = False
        with buffer.lock:
            address = self.address_of(buffer)
            if address is None:
                return
            self._mem_unmap(buffer, address)
            with self._lock:
                del self._mapped[buffer]
                self._stale.discard(buffer)
            due = buffer.drop_mapping()
        if due:
            buffer.release()

    def _mem_unmap(self, buffer: DmaBuffer, address: int) -> None:
        req = abi.fastrpc_mem_unmap(vesion=0, fd=buffer.fd, vaddr=address, length=buffer.size)
        rc = self._device.ioctl(abi.FASTRPC_IOCTL_MEM_UNMAP, req)
        if rc != 0:
            raise RpcError(ErrorCode.MMAP_FAILED, code=rc)

    def unmap_for_good(self, buffer: DmaBuffer) -> None:
        """Undo this session's mapping of ``buffer``, which is going away. When the
        MEM_UNMAP fails the kernel keeps the mapping under the fd's number: the mapping
        then stays counted (so the fd stays open and no later buffer can get its number
        and alias it) until the session closes, and the failure is raised."""
        if self._life.dead or self._life.process_ended:
            return  # the process is gone: its mappings go with rpc_fd at close
        due = False
        with buffer.lock:
            address = self.address_of(buffer)
            if address is None:
                return
            try:
                self._mem_unmap(buffer, address)
            except RpcError as exc:
                with self._lock:
                    self._stale.add(buffer)
                log.warning(
                    "MEM_UNMAP failed: keeping the buffer's fd open until the session closes",
                    extra={"buffer": buffer.id, "error": str(exc)},
                )
                raise
            with self._lock:
                del self._mapped[buffer]
            due = buffer.drop_mapping()
        if due:
            buffer.release()

    def counts(self) -> tuple[int, int]:
        """Buffers mapped here, and how many of them are stale."""
        with self._lock:
            return len(self._mapped), len(self._stale)

    def drop_all(self) -> list[DmaBuffer]:
        """At close: every mapping goes with the process (or with rpc_fd). Returns the
        buffers whose last holder this session was (due for release)."""
        with self._lock:
            mapped = list(self._mapped)
            self._mapped.clear()
            self._stale.clear()
        due = []
        for buffer in mapped:
            with buffer.lock:
                if buffer.drop_mapping():
                    due.append(buffer)
        return due


def check_bank(buffer: DmaBuffer) -> None:
    """A buffer whose compute bank a subsystem restart removed is never given to a DSP."""
    if buffer.bank_lost:
        raise RpcError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"buffer {buffer.id} was allocated in a compute bank that a DSP restart "
            "removed; allocate a new one",
        )


def whole_buffer_map(
    buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD, *, length: int | None = None
) -> abi.fastrpc_mem_map:
    """MEM_MAP of ``buffer`` by fd (FASTRPC_MAP_FD unless told), at its host address: all
    of it, or its first ``length`` bytes."""
    return abi.fastrpc_mem_map(
        version=0,
        fd=buffer.fd,
        offset=0,
        flags=flags,
        vaddrin=buffer.host_address,
        length=buffer.size if length is None else length,
        attrs=0,
    )

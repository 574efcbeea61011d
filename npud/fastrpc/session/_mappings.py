"""DSP mappings: MEM_MAP and MEM_UNMAP of DMA-BUFs into the session's DSP process, and
the stale mappings a failed MEM_UNMAP leaves (their fds stay open until close)."""

from __future__ import annotations

from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.trace_hooks import Record
from npud.fastrpc.session._state import SessionState, log

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


class Mappings(SessionState):
    """Which buffers are mapped into the DSP process, and at which DSP address."""

    def map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        """Map ``buffer`` into the DSP process (MEM_MAP with ``flags``: FASTRPC_MAP_FD, or
        FASTRPC_MAP_FD_DELAYED to let the DSP map it at its first use, or another of
        :data:`MAP_FLAGS`); idempotent. Returns the DSP address."""
        if flags not in MAP_FLAGS:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"map flags {flags}: not a value libcdsprpc passes on (RESERVED, or past"
                " the extended FD_DELAYED)",
            )
        args: Record = {"buffer": buffer.trace_ref}
        if flags != abi.FASTRPC_MAP_FD:
            args["flags"] = flags
        return self._traced(
            "map",
            lambda: args,
            lambda: self._map(buffer, flags),
            lambda address: {"address": address},
        )

    def _map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        self._check_usable()
        self._require_process()
        check_bank(buffer)
        with buffer.lock:
            if buffer.released or buffer.release_pending:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            address = self._mapped.get(buffer)
            if address is not None:
                return address
            req = whole_buffer_map(buffer, flags)
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_MEM_MAP, req)
            if rc != 0:
                raise RpcError(ErrorCode.MMAP_FAILED, code=rc)
            address = int(req.vaddrout)
            buffer.add_mapping()
            with self._state_lock:
                self._mapped[buffer] = address
            return address

    def address_of(self, buffer: DmaBuffer) -> int | None:
        """Where ``buffer`` is mapped in this session's DSP process, or None."""
        with self._state_lock:
            return self._mapped.get(buffer)

    def unmap(self, buffer: DmaBuffer, *, going: bool = False) -> None:
        """Undo :meth:`map`; a buffer that is not mapped here is left as it is. When the
        MEM_UNMAP fails the buffer stays mapped (and usable); a retry may succeed.

        ``going``: its holder is letting the buffer go. A failed MEM_UNMAP then keeps
        the mapping counted until the session closes (the kernel still holds it under
        the fd's number, so the fd must stay open), and the failure is raised.
        """
        args = {"buffer": buffer.trace_ref}
        if going:
            self._traced("unmap", lambda: args, lambda: self._unmap_for_good(buffer))
        else:
            self._traced("unmap", lambda: args, lambda: self._unmap(buffer))

    def _unmap(self, buffer: DmaBuffer) -> None:
        self._check_usable()
        due = False
        with buffer.lock:
            address = self._mapped.get(buffer)
            if address is None:
                return
            self._mem_unmap(buffer, address)
            with self._state_lock:
                del self._mapped[buffer]
                self._stale.discard(buffer)
            due = buffer.drop_mapping()
        if due:
            buffer.release()

    def _mem_unmap(self, buffer: DmaBuffer, address: int) -> None:
        req = abi.fastrpc_mem_unmap(vesion=0, fd=buffer.fd, vaddr=address, length=buffer.size)
        rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_MEM_UNMAP, req)
        if rc != 0:
            raise RpcError(ErrorCode.MMAP_FAILED, code=rc)

    def _unmap_for_good(self, buffer: DmaBuffer) -> None:
        """Undo this session's mapping of ``buffer``, which is going away. When the
        MEM_UNMAP fails the kernel keeps the mapping under the fd's number: the mapping
        then stays counted (so the fd stays open and no later buffer can get its number
        and alias it) until the session closes, and the failure is raised."""
        if self._dead or self._process_ended:
            return  # the process is gone: its mappings go with rpc_fd at close
        due = False
        with buffer.lock:
            if buffer not in self._mapped:
                return
            try:
                self._mem_unmap(buffer, self._mapped[buffer])
            except RpcError as exc:
                with self._state_lock:
                    self._stale.add(buffer)
                log.warning(
                    "MEM_UNMAP failed: keeping the buffer's fd open until the session closes",
                    extra={"buffer": buffer.id, "error": str(exc)},
                )
                raise
            with self._state_lock:
                del self._mapped[buffer]
            due = buffer.drop_mapping()
        if due:
            buffer.release()


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

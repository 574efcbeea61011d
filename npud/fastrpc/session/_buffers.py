"""DMA buffers: ALLOC_DMA_BUFF, the buffers the session owns, and their release
(deferred while an invoke pins them or another holder maps them)."""

from __future__ import annotations

import contextlib
import ctypes
import errno

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DeviceFd, DmaBuffer, checked_dma_size
from npud.fastrpc.kernel.errors import DriverCall, RpcError, translate_os_error
from npud.fastrpc.session._device import as_ioctl_arg
from npud.fastrpc.session._mappings import Mappings
from npud.fastrpc.session._state import log


class Buffers(Mappings):
    """The DMA-BUFs allocated on the session's fd, owned here until freed."""

    def alloc(self, size: int) -> DmaBuffer:
        """Allocate a DMA-BUF of ``size`` bytes (page-rounded) with a host mapping."""
        return self._traced(
            "alloc",
            lambda: {"size": size},
            lambda: self._alloc(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def _alloc(self, size: int) -> DmaBuffer:
        self._check_usable()
        buffer = self._allocate(size)
        with self._state_lock:
            if self._closing:
                closing = True
            else:
                closing = False
                self._buffers[buffer.id] = buffer
        if closing:
            self._discard(buffer)
            raise RpcError(ErrorCode.SESSION_CLOSED)
        return buffer

    def alloc_unowned(self, size: int) -> DmaBuffer:
        """A DMA-BUF from ALLOC_DMA_BUFF on this session's device that the *caller* owns:
        the session neither tracks nor releases it (where there is no system heap, the
        daemon's buffers come from here). Closing its fd frees it; the kernel keeps the
        memory in this session's context bank, and it lives on after the session closes.
        """
        # No FREE_DMA_BUFF before the close: it would need this session's fd, and closing
        # frees the buffer anyway (mainline has no FREE_DMA_BUFF).
        return self._traced(
            "alloc_unowned",
            lambda: {"size": size},
            lambda: self._alloc_unowned(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def _alloc_unowned(self, size: int) -> DmaBuffer:
        self._check_usable()
        return self._allocate(size, owned=False)

    def _allocate(self, size: int, *, owned: bool = True) -> DmaBuffer:
        """A DMA-BUF of ``size`` bytes rounded up to whole pages, mapped on the host."""
        allocated = checked_dma_size(size)
        req = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0, size=allocated)
        self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, req)
        if int(req.fd) < 0:  # pragma: no cover - a kernel that succeeds always sets it
            raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="the driver returned no fd")
        fd = DeviceFd(int(req.fd), self._driver.close)
        try:
            host = self._driver.mmap(fd.fileno(), allocated)
        except OSError as exc:
            fd.close()
            raise translate_os_error(exc, DriverCall.MMAP, device=self.device) from None
        except BaseException:
            fd.close()
            raise
        return DmaBuffer(
            next(self._buffer_ids),
            fd,
            allocated,
            host,
            before_close=self._free_dma_buff if owned else None,
            bank=self.bank,
            hooks=self._hooks,
            trace_session=self._trace_session,
        )

    def buffer(self, buffer_id: int) -> DmaBuffer:
        try:
            return self._buffers[buffer_id]
        except KeyError:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer_id) from None

    def owns(self, buffer: DmaBuffer) -> bool:
        """True while ``buffer`` is one of this session's (allocated here, not yet freed)."""
        with self._state_lock:
            return self._buffers.get(buffer.id) is buffer

    def free(self, buffer: DmaBuffer) -> None:
        """Release ``buffer`` (allocated here): DSP unmap, host munmap, close. Deferred
        while an invoke uses it or another session still has it mapped."""
        self._traced("free", lambda: {"buffer": buffer.trace_ref}, lambda: self._free(buffer))

    def _free(self, buffer: DmaBuffer) -> None:
        with self._state_lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            del self._buffers[buffer.id]
        try:
            self._unmap_for_good(buffer)
        finally:
            if buffer.request_release():
                buffer.release()

    def _discard(self, buffer: DmaBuffer) -> None:
        """Release a buffer of the session's own (the shell, a shared file), quietly."""
        with contextlib.suppress(RpcError):  # kept mapped, counted stale: released at close
            self._unmap_for_good(buffer)
        if buffer.request_release():
            self._release_quietly(buffer)

    def _free_dma_buff(self, fd: int) -> None:
        """FREE_DMA_BUFF where a kernel implements it; ENOTTY means closing frees."""
        if not self._free_supported or self._dead:
            return
        arg = ctypes.c_uint32(fd)
        try:
            self._driver.ioctl(
                self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_FREE_DMA_BUFF, as_ioctl_arg(arg)
            )
        except OSError as exc:
            if exc.errno == errno.ENOTTY:
                self._free_supported = False
            else:
                log.warning(
                    "FREE_DMA_BUFF failed; closing the fd frees it", extra={"error": exc.strerror}
                )

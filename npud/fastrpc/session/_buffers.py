"""DMA buffers: ALLOC_DMA_BUFF, the buffers the session owns, and their release
(deferred while an invoke pins them or another holder maps them)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import threading

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import ComputeBank, DeviceFd, DmaBuffer, checked_dma_size
from npud.fastrpc.kernel.errors import DriverCall, RpcError, translate_os_error
from npud.fastrpc.kernel.trace_hooks import TraceHooks
from npud.fastrpc.session._device import Device, as_ioctl_arg
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log
from npud.fastrpc.session._mappings import Mappings


class Buffers:
    """The DMA-BUFs allocated on the session's fd, owned here until freed.

    ``hooks`` and ``trace_session`` go to each buffer made here: a buffer reports its
    own release to a trace (:mod:`npud.fastrpc.kernel.dma`), since it may outlive the
    call that let go of it."""

    def __init__(
        self,
        device: Device,
        life: Life,
        mappings: Mappings,
        bank: ComputeBank,
        *,
        hooks: TraceHooks | None = None,
        trace_session: int = 0,
    ) -> None:
        self._device = device
        self._life = life
        self._mappings = mappings
        self._bank = bank
        self._hooks = hooks
        self._trace_session = trace_session
        self._lock = threading.Lock()
        self._buffers: dict[int, DmaBuffer] = {}  # allocated here, not yet freed
        self._closed = False  # take_all() ran: no buffer is kept any more
        self._ids = itertools.count(1)
        self._free_supported = True

    def alloc(self, size: int) -> DmaBuffer:
        """A DMA-BUF of ``size`` bytes (page-rounded) with a host mapping, owned here."""
        self._life.check_usable()
        buffer = self.allocate(size)
        with self._lock:
            kept = not self._closed and not self._life.closing
            if kept:
                self._buffers[buffer.id] = buffer
        if not kept:
            self.discard(buffer)
            raise RpcError(ErrorCode.SESSION_CLOSED)
        return buffer

    def alloc_unowned(self, size: int) -> DmaBuffer:
        """A DMA-BUF that the *caller* owns (see FastRpcSession.alloc_unowned)."""
        # No FREE_DMA_BUFF before the close: it would need this session's fd, and closing
        # frees the buffer anyway (mainline has no FREE_DMA_BUFF).
        self._life.check_usable()
        return self.allocate(size, owned=False)

    def allocate(self, size: int, *, owned: bool = True) -> DmaBuffer:
        """A DMA-BUF of ``size`` bytes rounded up to whole pages, mapped on the host; not
        kept here (the shell's and shared files' owners keep theirs)."""
        allocated = checked_dma_size(size)
        req = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0, size=allocated)
        self._device.ioctl(abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, req)
        if int(req.fd) < 0:  # pragma: no cover - a kernel that succeeds always sets it
            raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="the driver returned no fd")
        driver = self._device.driver
        fd = DeviceFd(int(req.fd), driver.close)
        try:
            host = driver.mmap(fd.fileno(), allocated)
        except OSError as exc:
            fd.close()
            raise translate_os_error(exc, DriverCall.MMAP, device=self._device.name) from None
        except BaseException:
            fd.close()
            raise
        return DmaBuffer(
            next(self._ids),
            fd,
            allocated,
            host,
            before_close=self._free_dma_buff if owned else None,
            bank=self._bank,
            hooks=self._hooks,
            trace_session=self._trace_session,
        )

    def buffer(self, buffer_id: int) -> DmaBuffer:
        with self._lock:
            found = self._buffers.get(buffer_id)
        if found is None:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer_id)
        return found

    def owns(self, buffer: DmaBuffer) -> bool:
        """True while ``buffer`` is one of this session's (allocated here, not yet freed)."""
        with self._lock:
            return self._buffers.get(buffer.id) is buffer

    def free(self, buffer: DmaBuffer) -> None:
        """Release ``buffer`` (allocated here): DSP unmap, host munmap, close. Deferred
        while an invoke uses it or another session still has it mapped."""
        with self._lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            del self._buffers[buffer.id]
        try:
            self._mappings.unmap_for_good(buffer)
        finally:
            if buffer.request_release():
                buffer.release()

    def discard(self, buffer: DmaBuffer) -> None:
        """Release a buffer of the session's own (the shell, a shared file), quietly."""
        with contextlib.suppress(RpcError):  # kept mapped, counted stale: released at close
            self._mappings.unmap_for_good(buffer)
        if buffer.request_release():
            release_quietly(buffer)

    def totals(self) -> tuple[int, int]:
        """Buffers owned here, and their bytes."""
        with self._lock:
            return len(self._buffers), sum(b.size for b in self._buffers.values())

    def take_all(self) -> list[DmaBuffer]:
        """At close: every buffer owned here, handed to the closer; none is kept after."""
        with self._lock:
            self._closed = True
            buffers = list(self._buffers.values())
            self._buffers.clear()
            return buffers

    @property
    def free_supported(self) -> bool:
        """False once the kernel answered FREE_DMA_BUFF with ENOTTY (closing frees)."""
        return self._free_supported

    def _free_dma_buff(self, fd: int) -> None:
        """FREE_DMA_BUFF where a kernel implements it; ENOTTY means closing frees."""
        if not self._free_supported or self._life.dead:
            return
        arg = ctypes.c_uint32(fd)
        try:
            self._device.driver.ioctl(
                self._device.fileno(), abi.FASTRPC_IOCTL_FREE_DMA_BUFF, as_ioctl_arg(arg)
            )
        except OSError as exc:
            if exc.errno == errno.ENOTTY:
                self._free_supported = False
            else:
                log.warning(
                    "FREE_DMA_BUFF failed; closing the fd frees it", extra={"error": exc.strerror}
                )


def release_quietly(buffer: DmaBuffer) -> None:
    """Release where a caller cannot act on a failure: log it, never strand the rest."""
    try:
        buffer.release()
    except (RpcError, BufferError, OSError) as exc:
        log.error("releasing buffer failed", extra={"buffer": buffer.id, "error": str(exc)})

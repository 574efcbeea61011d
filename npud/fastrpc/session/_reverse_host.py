"""The reverse host: what the DSP's reverse calls need from the session, heap growth for
apps_mem and shared files for apps_std's ``_fd`` calls. Runs on the listener thread."""

from __future__ import annotations

import threading
from typing import Final

from npu_protocol import AEE
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.driver import IoctlArg
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.reverse.apps_std import ENORPCMEMORY, SharedSource, SharingError
from npud.fastrpc.reverse.reverse_modules import aee_for_errno
from npud.fastrpc.session._buffers import Buffers, release_quietly
from npud.fastrpc.session._device import Device
from npud.fastrpc.session._log import log
from npud.fastrpc.session._mappings import Mappings, whole_buffer_map

SHARE_CHUNK: Final = 1024 * 1024


class ReverseHost:
    """What the reverse modules need from the session: heap growth (MMAP / MUNMAP on
    ``rpc_fd``) for apps_mem, and shared files (a DMA-BUF MEM_MAP'd with
    FASTRPC_MAP_FD) for the apps_std ``_fd`` calls. Runs on the listener thread."""

    def __init__(self, device: Device, buffers: Buffers, mappings: Mappings) -> None:
        self._device = device
        self._buffers = buffers
        self._mappings = mappings
        self._lock = threading.Lock()
        self._shared: dict[int, DmaBuffer] = {}  # apps_std *_fd files, by fd

    # -- apps_mem ---------------------------------------------------------------
    def heap_map(self, size: int, flags: int) -> tuple[int, int]:
        request = abi.fastrpc_req_mmap(fd=-1, flags=flags, vaddrin=0, size=size)
        rc = self._raw_ioctl(abi.FASTRPC_IOCTL_MMAP, request)
        return rc, int(request.vaddrout)

    def heap_unmap(self, vaddr: int, size: int) -> int:
        request = abi.fastrpc_req_munmap(vaddrout=vaddr, size=size)
        return self._raw_ioctl(abi.FASTRPC_IOCTL_MUNMAP, request)

    def _raw_ioctl(self, request: int, arg: IoctlArg) -> int:
        """The errno stays an OSError here: apps_mem answers the DSP with an AEE code."""
        return self._device.raw_ioctl(request, arg)

    # -- apps_std *_fd ------------------------------------------------------------
    def share(self, source: SharedSource, size: int) -> int:
        try:
            buffer = self._buffers.allocate(max(size, 1))
        except RpcError as exc:
            log.warning("no DMA-BUF for a file the DSP reads", extra={"error": str(exc)})
            raise SharingError(ENORPCMEMORY) from None  # as apps_std_fopen_fd answers
        try:
            view = buffer.view()
            done = 0
            while done < size:
                data = source.read_at(done, min(SHARE_CHUNK, size - done))
                if not data:
                    raise SharingError(int(AEE.EFREAD))
                view[done : done + len(data)] = data
                done += len(data)
            del view
            # The file's size, not the page-rounded buffer's: what libcdsprpc's fopen_fd maps.
            request = whole_buffer_map(buffer, length=size)
            try:
                rc = self._raw_ioctl(abi.FASTRPC_IOCTL_MEM_MAP, request)
            except OSError as exc:
                raise SharingError(aee_for_errno(exc.errno)) from None
            if rc != 0:
                raise SharingError(rc)
            with buffer.lock:
                self._mappings.add(buffer, int(request.vaddrout))
        except BaseException:
            self._buffers.discard(buffer)
            raise
        with self._lock:
            self._shared[buffer.fd] = buffer
        return buffer.fd

    def unshare(self, fd: int) -> None:
        with self._lock:
            buffer = self._shared.pop(fd, None)
        if buffer is None:
            raise SharingError(int(AEE.EBADFD))
        try:
            self._mappings.unmap_for_good(buffer)
        except RpcError:
            raise SharingError(int(AEE.EFAILED)) from None
        finally:
            if buffer.request_release():
                release_quietly(buffer)

    def take_all(self) -> list[DmaBuffer]:
        """At close: the shared files still held, handed to the closer."""
        with self._lock:
            shared = list(self._shared.values())
            self._shared.clear()
            return shared

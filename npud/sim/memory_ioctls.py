"""The emulated driver's memory commands: ALLOC_DMA_BUFF, MMAP, MUNMAP, MEM_MAP, MEM_UNMAP.

Each decodes its struct from the ioctl argument and answers as ``drivers/misc/fastrpc.c``
does (docs/emulator.md): the errno for what the kernel refuses itself, a DSP result
for what the DSP refuses. :class:`npud.sim.driver.EmulatedDriver` routes the commands
here; the DSP process of the fd keeps the mappings.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Final

from npu_protocol.aee import AEE
from npud.sim import layout
from npud.sim.addrspace import AddressSpaceFullError
from npud.sim.config import SimConfig
from npud.sim.device_file import DeviceFile
from npud.sim.dmabuf import DmaBuf, DmaBufRegistry
from npud.sim.errors import fault
from npud.sim.ioctl_args import IoctlBuffer, arg_view
from npud.sim.mappings import dsp_mapping
from npud.sim.memory import MemMapping

ADSP_MMAP_ADD_PAGES: Final = 0x1000
ADSP_MMAP_REMOTE_HEAP_ADDR: Final = 0x8


class MemoryIoctls:
    """The memory commands of one driver; ``require_alive`` raises EPIPE once the
    fd's channel died (the driver's check, under its lock)."""

    def __init__(
        self,
        config: SimConfig,
        dmabufs: DmaBufRegistry,
        require_alive: Callable[[DeviceFile, str], None],
    ) -> None:
        self._config = config
        self._dmabufs = dmabufs
        self._require_alive = require_alive

    def alloc_dma_buff(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.ALLOC_DMA_BUF_STRUCT.size, writable=True)
        request = layout.AllocDmaBuf._make(layout.ALLOC_DMA_BUF_STRUCT.unpack(view))
        fd = self._dmabufs.allocate(request.size, bank=device.channel.generation)
        layout.S32.pack_into(view, layout.ALLOC_DMA_BUF_FD_OFFSET, fd)
        return 0

    def stale_alias(self, device: DeviceFile) -> Callable[[int], MemMapping | None] | None:
        """With ``map_match_fd_only``: the mapping an fd number finds (old kernels)."""
        process = device.process
        if not self._config.map_match_fd_only or process is None:
            return None
        return process.memory.find_by_fd

    def mmap(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.REQ_MMAP_STRUCT.size, writable=True)
        request = layout.ReqMmap._make(layout.REQ_MMAP_STRUCT.unpack(view))
        if request.flags not in (ADSP_MMAP_ADD_PAGES, ADSP_MMAP_REMOTE_HEAP_ADDR):
            raise fault(errno.EINVAL, f"MMAP: flags {request.flags:#x} not supported")
        if request.vaddrin:
            raise fault(errno.EINVAL, "MMAP: vaddrin must be 0")
        if request.size == 0 or request.size > self._config.max_dma_buf_size:
            raise fault(errno.ENOMEM, f"MMAP: cannot allocate {request.size} bytes")
        self._require_alive(device, "MMAP")
        process = device.process
        if process is None or process.exited:
            return AEE.EBADSTATE.dsp
        try:
            vaddr = process.memory.add_heap(request.size, request.flags)
        except AddressSpaceFullError:
            raise fault(errno.ENOMEM, "MMAP: the DSP address space is full") from None
        layout.U64.pack_into(view, layout.REQ_MMAP_VADDROUT_OFFSET, vaddr)
        return 0

    def munmap(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.REQ_MUNMAP_STRUCT.size, writable=False)
        request = layout.ReqMunmap._make(layout.REQ_MUNMAP_STRUCT.unpack(view))
        process = device.process
        if process is None or not process.memory.has_heap(request.vaddrout, request.size):
            raise fault(errno.EINVAL, "MUNMAP: no buffer with that address and size")
        self._require_alive(device, "MUNMAP")
        if not process.memory.remove_heap(request.vaddrout, request.size):
            raise fault(errno.EINVAL, "MUNMAP: no buffer with that address and size")
        return 0

    def mem_map(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.MEM_MAP_STRUCT.size, writable=True)
        request = layout.MemMap._make(layout.MEM_MAP_STRUCT.unpack(view))
        alias = self.stale_alias(device)
        stale = alias(request.fd) if alias is not None else None
        if stale is not None:
            return self._mem_map_alias(device, view, request, stale)
        # EBADF when not an fd; None (EINVAL) too when a restart took its compute bank.
        buffer = self._dmabufs.identify(request.fd, channel=device.channel.generation)
        if buffer is None:
            raise fault(errno.EINVAL, f"MEM_MAP: fd {request.fd} is not a dma-buf")
        if request.length > buffer.size:
            raise fault(errno.EINVAL, "MEM_MAP: length exceeds the dma-buf")
        self._require_alive(device, "MEM_MAP")
        process = device.process
        if process is None or process.exited:
            return AEE.EBADSTATE.dsp
        if not self._fits(buffer, request.offset, request.length):
            return AEE.EBADPARM.dsp
        mapping = dsp_mapping(request.fd, buffer)
        try:
            vaddr = process.map_buffer(
                request.fd, buffer, mapping, request.offset, request.length, request.flags
            )
        except AddressSpaceFullError:
            mapping.close()
            raise fault(errno.ENOMEM, "MEM_MAP: the DSP address space is full") from None
        layout.U64.pack_into(view, layout.MEM_MAP_VADDROUT_OFFSET, vaddr)
        return 0

    def _mem_map_alias(
        self, device: DeviceFile, view: memoryview, request: layout.MemMap, stale: MemMapping
    ) -> int:
        """An old kernel reuses the map its fd number finds: the DSP maps *that* buffer."""
        self._require_alive(device, "MEM_MAP")
        process = device.process
        if process is None or process.exited:
            return AEE.EBADSTATE.dsp
        if not self._fits(stale.buffer, request.offset, request.length):
            return AEE.EBADPARM.dsp
        try:
            vaddr = process.map_alias(request.fd, stale, request.offset, request.length)
        except AddressSpaceFullError:
            raise fault(errno.ENOMEM, "MEM_MAP: the DSP address space is full") from None
        layout.U64.pack_into(view, layout.MEM_MAP_VADDROUT_OFFSET, vaddr)
        return 0

    @staticmethod
    def _fits(buffer: DmaBuf, offset: int, length: int) -> bool:
        return length > 0 and offset >= 0 and offset + length <= buffer.size

    def mem_unmap(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.MEM_UNMAP_STRUCT.size, writable=False)
        request = layout.MemUnmap._make(layout.MEM_UNMAP_STRUCT.unpack(view))
        process = device.process
        entry = process.memory.find_map(request.vaddr, request.fd) if process else None
        if process is None or entry is None:
            raise fault(errno.EINVAL, "MEM_UNMAP: no mapping at that address for that fd")
        self._require_alive(device, "MEM_UNMAP")
        if not process.unmap(entry):
            raise fault(errno.EINVAL, "MEM_UNMAP: no mapping at that address for that fd")
        return 0

"""The kernel half of INVOKE: turning the user's argument array into DSP buffers and back.

Mirrors ``fastrpc_get_args``/``fastrpc_put_args``:

* a buffer with fd -1 or 0 (or length 0) is plain memory: input bytes are
  copied in before the call, output bytes copied back to ``ptr`` after it
  (whatever the DSP's result: the kernel copies back before it looks at it);
  plain buffers that overlap in user memory share one payload region, so an
  output overlapping an input starts out holding the input's bytes;
* any other fd must be a dma-buf of this emulator and ``ptr..ptr+length`` must
  lie in a mapping of it: the DSP then works on that memory directly, through
  the emulator's own mapping of the buffer, held for the duration of the call
  (and kept for later calls while the caller's mapping lives, see
  :mod:`npud.sim.mappings`);
* handle slots must carry dma-buf fds; nothing is passed for them;
* with an ``alias`` lookup (kernels that find a map by fd number only,
  ``SimConfig.map_match_fd_only``), an fd number that a recorded mapping was
  made through uses that mapping's memory, whatever the fd names now; the
  offset comes from the VMA that contains ``ptr``, as the kernel computes it.

All plain inputs are copied in one ``process_vm_readv`` and all plain outputs
back in one ``process_vm_writev``.

For a PD child (``SimConfig.pd_isolation="process"``) the arguments also
describe where each buffer is (``for_child``, :attr:`InvokeArguments.spans`):
a dma-buf by its DSP mapping's memory id and an fd of it, a plain buffer by
its place in the payload; and a payload larger than a message can carry is
built in a memfd (:attr:`InvokeArguments.payload_fd`) that the child maps
too: the skel reads and writes the kernel's copy in place.

Failures: EINVAL for anything about a dma-buf argument, EFAULT for unreadable
or unwritable plain memory, ENOMEM when the plain buffers together exceed
what the kernel could allocate for its payload.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self

from npud.sim.dmabuf import DmaBuf, DmaBufRegistry
from npud.sim.errors import fault
from npud.sim.layout import InvokeArg, Scalars
from npud.sim.mappings import DspMemory, MappingTable
from npud.sim.pd_child_handle import BufferSpan, MemoryRef
from npud.sim.pd_wire import INLINE_MAX
from npud.sim.usermem import Copy, UserMemory
from npud.sim.vmas import VmaFinder

PAYLOAD_MEMFD_NAME = "fastrpc-payload"


class StaleMapping(Protocol):
    """What an fd-number lookup finds: a recorded mapping's buffer and memory."""

    id: int
    buffer: DmaBuf
    mapping: mmap.mmap


def _is_plain(arg: InvokeArg) -> bool:
    return arg.fd in (0, -1) or arg.length == 0


class InvokeArguments:
    """The buffers of one INVOKE; a context manager that releases every view and mapping."""

    def __init__(
        self,
        usermem: UserMemory,
        dmabufs: DmaBufRegistry,
        mappings: MappingTable,
        scalars: Scalars,
        args: Sequence[InvokeArg],
        max_payload: int,
        alias: Callable[[int], StaleMapping | None] | None = None,
        *,
        for_child: bool = False,
        channel: int | None = None,
    ) -> None:
        self._usermem = usermem
        self._channel = channel  # the generation of the channel the call goes to
        self._for_child = for_child
        self._alias = alias
        self._max_payload = max_payload
        self._dmabufs = dmabufs
        self._mappings = mappings
        self._inbufs = scalars.inbufs
        self._nbufs = scalars.inbufs + scalars.outbufs
        self._args = args
        self._views: list[memoryview] = []  # every view handed out, released at exit
        self._memory: dict[tuple[int, int], DspMemory] = {}  # the DSP's mapping, per buffer
        self._buffers: list[memoryview] = []
        self._local: dict[int, int] = {}  # plain argument index -> its payload address
        self._placed: dict[int, int] = {}  # plain argument index -> its payload offset
        self.inbufs = scalars.inbufs
        self.spans: list[BufferSpan] = []
        """Where each buffer is, for a PD child (inputs then outputs; ``for_child`` only)."""
        self.payload: memoryview = memoryview(b"")
        """The whole payload: the kernel's copy of the plain buffers."""
        self.payload_fd: int | None = None
        """A memfd holding the payload (``for_child`` and too large for a message)."""
        self._payload_map: mmap.mmap | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for view in reversed(self._views):
            view.release()
        self._views.clear()
        for memory in self._memory.values():
            memory.release()
        self._memory.clear()
        self.payload = memoryview(b"")
        if self._payload_map is not None:
            self._payload_map.close()
            self._payload_map = None
        if self.payload_fd is not None:
            os.close(self.payload_fd)
            self.payload_fd = None

    def _track(self, view: memoryview) -> memoryview:
        self._views.append(view)
        return view

    def prepare(self) -> tuple[list[memoryview], list[memoryview]]:
        """Map dma-bufs, build the payload, copy inputs in: (inputs, outputs) for the DSP."""
        buffers: list[memoryview | None] = [None] * self._nbufs
        spans: list[BufferSpan | None] = [None] * self._nbufs
        for index, arg in enumerate(self._args):
            if _is_plain(arg):
                continue
            stale = self._alias(arg.fd) if self._alias is not None else None
            if stale is not None:
                if index < self._nbufs:
                    offset = self._aliased(index, arg, stale)
                    whole = self._track(memoryview(stale.mapping))
                    buffers[index] = self._track(whole[offset : offset + arg.length])
                    ref = MemoryRef(stale.id, None, stale.buffer.size, cached=True)
                    spans[index] = BufferSpan(ref, offset, arg.length)
                continue
            buffer = self._dma_buf(index, arg)
            if index < self._nbufs:
                offset, memory = self._locate(index, arg, buffer)
                whole = self._track(memoryview(memory.mapping))
                buffers[index] = self._track(whole[offset : offset + arg.length])
                ref = MemoryRef(memory.id, arg.fd, buffer.size, cached=memory.cached)
                spans[index] = BufferSpan(ref, offset, arg.length)
        complete = self._build_payload(buffers)
        if self._for_child:
            self.spans = [
                span if span is not None else BufferSpan(None, self._placed[index], arg.length)
                for index, (span, arg) in enumerate(zip(spans, self._args, strict=False))
            ]
        # Every plain input in one process_vm_readv (the kernel's copy_from_user per buffer).
        self._usermem.read_many(
            [
                Copy(self._args[index].ptr, self._local[index], self._args[index].length)
                for index in range(self._inbufs)
                if index in self._local
            ]
        )
        self._buffers = complete
        inputs = [self._track(view.toreadonly()) for view in complete[: self._inbufs]]
        return inputs, complete[self._inbufs :]

    def _dma_buf(self, index: int, arg: InvokeArg) -> DmaBuf:
        try:
            buffer = self._dmabufs.identify(arg.fd, channel=self._channel)
        except OSError:
            buffer = None
        if buffer is None:
            raise fault(errno.EINVAL, f"INVOKE arg {index}: fd {arg.fd} is not a dma-buf")
        if arg.length > buffer.size:
            raise fault(
                errno.EINVAL,
                f"INVOKE arg {index}: length {arg.length} exceeds the {buffer.size}-byte dma-buf",
            )
        return buffer

    def _aliased(self, index: int, arg: InvokeArg, stale: StaleMapping) -> int:
        """The offset in ``stale``'s buffer that the kernel computes from the VMA."""
        vma = VmaFinder().find(arg.ptr)
        offset = arg.ptr - vma.start if vma is not None else -1
        if offset < 0 or offset + arg.length > stale.buffer.size:
            raise fault(errno.EINVAL, f"INVOKE arg {index}: outside the mapped buffer")
        return offset

    def _locate(self, index: int, arg: InvokeArg, buffer: DmaBuf) -> tuple[int, DspMemory]:
        """The argument's offset in ``buffer`` and the DSP's mapping of it (one per buffer)."""
        operation = f"INVOKE arg {index}"
        memory = self._memory.get(buffer.key)
        if memory is not None:
            return self._mappings.locate(buffer, arg.ptr, arg.length, operation), memory
        offset, memory = self._mappings.dsp_memory(arg.fd, buffer, arg.ptr, arg.length, operation)
        self._memory[buffer.key] = memory
        return offset, memory

    def _build_payload(self, buffers: list[memoryview | None]) -> list[memoryview]:
        """Give plain buffers views of the payload: one zeroed region per overlapping run,
        the regions one after the other in one buffer."""
        spans = sorted(
            (arg.ptr, arg.ptr + arg.length, index)
            for index, arg in enumerate(self._args[: self._nbufs])
            if buffers[index] is None and arg.length
        )
        regions: list[list[int]] = []  # [start, end]
        owner: dict[int, int] = {}  # argument index -> region index
        for start, end, index in spans:
            if regions and start < regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], end)
            else:
                regions.append([start, end])
            owner[index] = len(regions) - 1
        size = sum(end - start for start, end in regions)
        if size > self._max_payload:
            raise fault(errno.ENOMEM, f"INVOKE: {size} bytes of plain buffers")
        # One payload for all regions, as the kernel allocates it.
        payload = self._allocate_payload(size)
        base = 0
        if size:
            anchor = ctypes.c_char.from_buffer(payload)
            base = ctypes.addressof(anchor)
            del anchor  # the payload is never resized; the views below keep it alive
        whole = self._track(memoryview(payload))
        self.payload = whole
        placed: list[int] = []  # region index -> its offset in the payload
        offset = 0
        for start, end in regions:
            placed.append(offset)
            offset += end - start
        complete: list[memoryview] = []
        for index, mapped in enumerate(buffers):
            arg = self._args[index]
            if mapped is not None:
                complete.append(mapped)
            elif not arg.length:
                self._placed[index] = 0
                complete.append(self._track(whole[0:0]))
            else:
                region = owner[index]
                offset = placed[region] + arg.ptr - regions[region][0]
                self._placed[index] = offset
                self._local[index] = base + offset
                complete.append(self._track(whole[offset : offset + arg.length]))
        return complete

    def _allocate_payload(self, size: int) -> bytearray | mmap.mmap:
        """Zeroed payload memory: a memfd a PD child can map when it is too large for a
        message (``for_child``), else a bytearray."""
        if not self._for_child or size <= INLINE_MAX:
            return bytearray(size)
        fd = os.memfd_create(PAYLOAD_MEMFD_NAME, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        self.payload_fd = fd
        self._payload_map = mapping
        return mapping

    def copy_out(self) -> None:
        """put_args: plain output buffers go back to user memory (EFAULT when unwritable)."""
        self._usermem.write_many(
            [
                Copy(self._args[index].ptr, self._local[index], self._args[index].length)
                for index in range(self._inbufs, self._nbufs)
                if index in self._local
            ]
        )

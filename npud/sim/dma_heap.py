"""The system DMA-BUF heap, ``/dev/dma_heap/system``, as drivers/dma-buf/dma-heap.c answers.

libcdsprpc's rpcmem allocates from it (reference section 7) and falls back to
FastRPC's ALLOC_DMA_BUFF when the node cannot be opened. One command,
``DMA_HEAP_IOCTL_ALLOC`` = ``_IOWR('H', 0, struct dma_heap_allocation_data)``
= 0xC0184800 (layout in :mod:`npud.sim.layout`). The kernel's dispatcher:

* looks only at the command's number: any number but 0 is **EINVAL** (the
  ``default: -ENOTTY`` of its switch cannot be reached), and a word with
  number 0 is the allocation whatever its type letter, with the size and the
  directions the word declares: it copies that many bytes in (if the word
  says write) and out (if it says read), zero-filling the rest of its 24;
* ``fd`` must be 0 on entry, ``fd_flags`` within ``O_CLOEXEC | O_ACCMODE``,
  ``heap_flags`` 0: else EINVAL;
* ``len`` is rounded up to whole pages (mod 2^64): 0 is EINVAL;
* the system heap fails with ENOMEM when it cannot allocate (the emulator:
  above ``SimConfig.max_dma_buf_size``, or an injected failure), and the fd's
  installation fails with its own errno (EMFILE...).

The buffer is a sealed memfd registered like ALLOC_DMA_BUFF's, so it can be
mapped, MEM_MAPped into any session and passed in INVOKE slices. It belongs
to no session: a subsystem restart does not touch it. ``O_CLOEXEC`` in
``fd_flags`` is honoured; the access mode is checked and otherwise ignored
(the emulator's fd is always read-write). When the new fd does not reach the
caller (the copy back fails with EFAULT, or the word declares no copy back
that covers the ``fd`` field), the kernel leaves it installed and unreported;
the emulator closes it.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from typing import Any, Final

from npud.sim import layout
from npud.sim.errors import fault

SYSTEM_HEAP_NODE: Final = "/dev/dma_heap/system"
MEMFD_NAME: Final = "dma_heap-system"
PAGE_SIZE: Final = mmap.PAGESIZE
U64_MASK: Final = (1 << 64) - 1

IOC_NRMASK: Final = 0xFF
IOC_SIZESHIFT: Final = 16
IOC_SIZEMASK: Final = 0x3FFF
IOC_IN: Final = 1 << 30  # _IOC_WRITE: the caller writes the argument (copy in)
IOC_OUT: Final = 2 << 30  # _IOC_READ: the caller reads it back (copy out)
COMMANDS: Final = 1  # dma_heap_ioctl_cmds[]: ALLOC only

Allocate = Callable[[int, bool], int]
"""(rounded length, close-on-exec) -> a new dma-buf fd (the caller owns it); OSError."""


def _user_view(arg: object, size: int, *, writable: bool) -> memoryview:
    """The first ``size`` bytes of the caller's argument; EFAULT when it has fewer (or
    cannot be written, for a copy out)."""
    if arg is None:
        raise fault(errno.EFAULT, "NULL ioctl argument")
    try:
        view = memoryview(arg).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise fault(errno.EFAULT, "the ioctl argument is not a buffer") from None
    if view.nbytes < size or (writable and view.readonly):
        raise fault(errno.EFAULT, f"the ioctl argument cannot be copied ({size} bytes)")
    return view[:size]


def page_align(length: int) -> int:
    """PAGE_ALIGN on a 64-bit size_t: wraps to 0 past the top."""
    return (length + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1) & U64_MASK


def heap_ioctl(
    request: int,
    arg: Any,
    allocate: Allocate,
    injected: Callable[[int], None],
) -> int:
    """One ioctl on a heap fd; 0 or OSError. ``injected(request)`` raises a queued fault."""
    request &= 0xFFFFFFFF
    if request & IOC_NRMASK >= COMMANDS:
        raise fault(errno.EINVAL, f"{request:#010x}: the DMA-BUF heap has no such command")
    injected(request)
    size = (request >> IOC_SIZESHIFT) & IOC_SIZEMASK
    in_size = size if request & IOC_IN else 0
    out_size = size if request & IOC_OUT else 0
    kdata = bytearray(max(in_size, out_size, layout.DMA_HEAP_ALLOCATION_STRUCT.size))
    if in_size:
        kdata[:in_size] = _user_view(arg, in_size, writable=False)
    data = layout.DmaHeapAllocation._make(layout.DMA_HEAP_ALLOCATION_STRUCT.unpack_from(kdata))
    if data.fd:
        raise fault(errno.EINVAL, "DMA_HEAP_IOCTL_ALLOC: fd must be 0 on entry")
    if data.fd_flags & ~layout.DMA_HEAP_VALID_FD_FLAGS:
        raise fault(errno.EINVAL, f"DMA_HEAP_IOCTL_ALLOC: fd_flags {data.fd_flags:#x}")
    if data.heap_flags & ~layout.DMA_HEAP_VALID_HEAP_FLAGS:
        raise fault(errno.EINVAL, f"DMA_HEAP_IOCTL_ALLOC: heap_flags {data.heap_flags:#x}")
    length = page_align(data.len)
    if not length:
        raise fault(errno.EINVAL, f"DMA_HEAP_IOCTL_ALLOC: len {data.len} is no page")
    fd = allocate(length, bool(data.fd_flags & os.O_CLOEXEC))
    layout.U32.pack_into(kdata, layout.DMA_HEAP_ALLOCATION_FD_OFFSET, fd)
    try:
        if out_size:
            target = _user_view(arg, out_size, writable=True)
            target[:] = kdata[:out_size]
    except OSError:
        os.close(fd)  # the kernel leaves it installed, unreported
        raise
    if out_size < layout.DMA_HEAP_ALLOCATION_FD_OFFSET + layout.U32.size:
        os.close(fd)  # not copied back: the caller cannot know it (the kernel leaks it)
    return 0

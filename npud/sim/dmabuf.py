"""The emulator's DMA-BUFs: sealed memfds, recognised by inode.

ALLOC_DMA_BUFF returns a fresh memfd (named ``fastrpc-dmabuf``) sealed against
growing and shrinking, so fd passing, mmap and leak tests are real. The
registry remembers each buffer by ``(st_dev, st_ino)``, never by fd number:
a ``dup``'d fd or one that came back over SCM_RIGHTS is still recognised.
It keeps no fd and no mapping of its own, so the memory is freed when the
caller closes its last fd and unmaps; only a MEM_MAP mapping or an in-flight
invoke holds a mapping (the kernel's refcounts).

The registry cannot see every close (fds are dup'd, passed to other
processes, closed with ``os.close``), so it forgets buffers in sweeps: when it
holds twice as many entries as were alive after the last sweep (and at least
:data:`SWEEP_MIN`), an allocation first drops every buffer this process no
longer references through an fd or a mapping. The registry stays within
about twice the live buffers, and a sweep's cost (a scan of ``/proc/self/fd``
and ``/proc/self/maps``) is spread over the allocations that made it due.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import mmap
import os
import threading
from typing import Final

from npud.sim.errors import fault
from npud.sim.vmas import read_maps

MEMFD_NAME: Final = "fastrpc-dmabuf"
PAGE_SIZE: Final = mmap.PAGESIZE
SEALS: Final = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
SWEEP_MIN: Final = 64
"""The registry never sweeps while it holds fewer entries than this."""


@dataclasses.dataclass(frozen=True)
class DmaBuf:
    """What the emulated kernel knows about one buffer."""

    device: int  # st_dev of the memfd
    inode: int
    size: int
    serial: int
    bank: int | None = None
    """The channel generation whose compute bank ALLOC_DMA_BUFF allocated it on; None
    for heap buffers, which belong to no channel."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.device, self.inode)

    @property
    def maps_identity(self) -> tuple[tuple[int, int], int]:
        """How the buffer appears in ``/proc/self/maps``: ((major, minor), inode)."""
        return ((os.major(self.device), os.minor(self.device)), self.inode)


class DmaBufRegistry:
    """Allocates buffers and answers "is this fd one of ours?"."""

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self._lock = threading.Lock()
        self._buffers: dict[tuple[int, int], DmaBuf] = {}
        self._allocated = 0
        self._sweep_at = SWEEP_MIN
        self._lost_banks: set[int] = set()

    def allocate(
        self,
        size: int,
        *,
        cloexec: bool = True,
        name: str = MEMFD_NAME,
        fd_error: int | None = errno.EINVAL,
        bank: int | None = None,
    ) -> int:
        """A new sealed memfd of ``size`` bytes; the caller owns the returned fd.
        ``bank``: the channel generation whose compute bank holds it (ALLOC_DMA_BUFF).

        A failed fd installation (EMFILE...) is ``fd_error`` (FastRPC reports EINVAL),
        or its own errno with None (the DMA-BUF heap)."""
        if size == 0:
            raise fault(errno.EINVAL, "ALLOC_DMA_BUFF: size 0")
        if size > self._max_size:
            raise fault(errno.ENOMEM, f"{size} bytes exceeds the DMA pool")
        with self._lock:
            due = len(self._buffers) >= self._sweep_at
        if due:
            self.sweep()
        flags = os.MFD_ALLOW_SEALING | (os.MFD_CLOEXEC if cloexec else 0)
        try:
            fd = os.memfd_create(name, flags)
        except OSError as exc:
            if fd_error is None:
                raise
            raise fault(fd_error, f"no fd for the buffer: {exc}") from None
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            status = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._allocated += 1
            buffer = DmaBuf(status.st_dev, status.st_ino, size, self._allocated, bank)
            self._buffers[buffer.key] = buffer
        return fd

    def sweep(self) -> None:
        """Forget every buffer that no fd or mapping of this process references any more.

        Only buffers registered before the scan started are considered (a newer
        one's fd may not have been listed yet).
        """
        with self._lock:
            known = dict(self._buffers)
        referenced = _referenced(known)
        with self._lock:
            for key, buffer in known.items():
                if key not in referenced and self._buffers.get(key) is buffer:
                    del self._buffers[key]
            self._sweep_at = max(SWEEP_MIN, 2 * len(self._buffers))

    def identify(self, fd: int, *, channel: int | None = None) -> DmaBuf | None:
        """The buffer behind ``fd``, None when it is not one of ours; EBADF for a non-fd.
        With ``channel`` (the generation of the channel it is to be given to): None too
        when its compute bank went with a subsystem restart (fds of that dead channel
        meet EPIPE first, as before)."""
        status = os.fstat(fd)
        with self._lock:
            buffer = self._buffers.get((status.st_dev, status.st_ino))
            if (
                buffer is not None
                and channel is not None
                and buffer.bank != channel
                and buffer.bank in self._lost_banks
            ):
                return None
            return buffer

    def lose_bank(self, generation: int) -> None:
        """A subsystem restart depopulated the compute banks of channel ``generation``:
        the buffers ALLOC_DMA_BUFF made there are no dma-bufs a DSP can be given any
        more (MEM_MAP, INVOKE and INIT_CREATE refuse them with EINVAL). Their memory
        stays readable through the holders' fds and mappings until those go."""
        with self._lock:
            self._lost_banks.add(generation)

    def require(self, fd: int, operation: str) -> DmaBuf:
        """Like :meth:`identify`, but a foreign fd is EINVAL (the kernel's attach failure)."""
        buffer = self.identify(fd)
        if buffer is None:
            raise fault(errno.EINVAL, f"{operation}: fd {fd} is not a dma-buf")
        return buffer

    @staticmethod
    def check_user_mmap(buffer: DmaBuf, length: int, offset: int) -> None:
        """dma_buf_mmap_internal: whole pages only, none past the buffer's last full page."""
        if length <= 0 or offset < 0 or offset % PAGE_SIZE:
            raise fault(errno.EINVAL, f"mmap: length {length} / offset {offset} not allowed")
        pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
        if offset // PAGE_SIZE + pages > buffer.size // PAGE_SIZE:
            raise fault(
                errno.EINVAL,
                f"mmap: {length} bytes at {offset} overflow the {buffer.size}-byte dma-buf"
                " (the kernel maps whole pages of it only)",
            )

    @property
    def allocated(self) -> int:
        """Buffers handed out since the driver was created."""
        with self._lock:
            return self._allocated

    @property
    def registered(self) -> int:
        """Buffers the registry remembers now (the live ones, and dead ones until a sweep)."""
        with self._lock:
            return len(self._buffers)

    def count_alive(self) -> int:
        """Buffers this process still references through an fd or a mapping.

        A buffer whose only fd was sent to another process is not counted:
        the emulator cannot see into other processes.
        """
        with self._lock:
            known = dict(self._buffers)
        return len(_referenced(known))


def _referenced(known: dict[tuple[int, int], DmaBuf]) -> set[tuple[int, int]]:
    """The keys of ``known`` that an fd or a mapping of this process refers to."""
    referenced: set[tuple[int, int]] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            status = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (or the listing's own fd)
        key = (status.st_dev, status.st_ino)
        if key in known:
            referenced.add(key)
    by_maps = {buffer.maps_identity: key for key, buffer in known.items()}
    for vma in read_maps():
        mapped = by_maps.get((vma.device, vma.inode))
        if mapped is not None:
            referenced.add(mapped)
    return referenced

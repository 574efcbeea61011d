"""SimStatistics: a snapshot of what the emulated kernel and DSP hold right now."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SimStatistics:
    """Counts for leak tests; every number is "currently", except the totals marked so.

    * ``device_fds_open``: device fds returned by open() and not yet closed.
    * ``releases_pending``: closed device fds whose release waits for an ioctl
      still running on another thread (the kernel's file refcount).
    * ``sessions_in_use`` / ``session_limit``: on the current channel.
    * ``dsp_processes``: processes alive on the DSP (created, not exited,
      channel up).
    * ``remote_handles_open``: handles from remotectl open, not closed.
    * ``mem_maps`` / ``mmap_buffers``: MEM_MAP mappings and MMAP heap buffers
      the kernel still records (fds not yet released, dead channels included).
    * ``dma_bufs_allocated``: total ALLOC_DMA_BUFF successes (a total).
    * ``dma_bufs_alive``: emulator buffers this process still references
      through an fd or a mapping (the emulator's own mappings included).
    * ``dma_bufs_registered``: buffers the emulated driver remembers: the live
      ones, and dead ones until its next sweep (about twice the live ones at most).
    * ``user_mappings_cached``: mappings made by ``EmulatedDriver.mmap`` that
      are still mapped (the address cache answers for them).
    * ``dsp_mappings_cached``: the DSP's own mappings of buffers kept with
      those for later calls.
    * ``invokes_in_flight``: INVOKE ioctls executing now (blocked listeners too).
    * ``reverse_requests_pending``: reverse-RPC requests queued or being served.
    * ``restarts``: subsystem restarts so far (a total).
    * ``dsp_up``: the device nodes exist.
    * ``pd_children``: PD child processes alive (process isolation: one per live
      DSP process).
    * ``pd_crashes``: DSP processes that crashed (a total): their child died on its
      own, or ``crash_process`` / ``faults.crash_next_invoke`` made it.
    * ``dma_heap_fds_open``: open fds of ``/dev/dma_heap/system``.
    * ``dma_heap_allocations``: DMA_HEAP_IOCTL_ALLOC successes (a total; counted in
      ``dma_bufs_allocated`` too).
    * ``interrupted_mmaps``: MMAP buffers the current channel took from fds whose
      invoke ERESTARTSYS interrupted (76e8e4ace1ed); never freed: the next restart
      only unlinks them (``lost_mmaps``).
    * ``contexts_in_use``: context ids of the current channel taken (at most 255):
      calls in flight and the interrupted calls of fds not yet released.
    * ``interrupted_contexts``: of those, the interrupted calls' (kept until their
      fds are released).
    * ``suspends``: system suspends so far (``faults.suspend`` and
      ``faults.suspend_next_invoke``; a total).
    * ``lost_mmaps`` / ``lost_mmap_bytes``: interrupted invokes' MMAP buffers that
      restarts unlinked without freeing them (totals; a reboot gets them back).
    """

    device_fds_open: int
    releases_pending: int
    sessions_in_use: int
    session_limit: int
    dsp_processes: int
    remote_handles_open: int
    mem_maps: int
    mmap_buffers: int
    dma_bufs_allocated: int
    dma_bufs_alive: int
    dma_bufs_registered: int
    user_mappings_cached: int
    dsp_mappings_cached: int
    invokes_in_flight: int
    reverse_requests_pending: int
    restarts: int
    dsp_up: bool
    pd_children: int
    pd_crashes: int
    dma_heap_fds_open: int
    dma_heap_allocations: int
    interrupted_mmaps: int = 0
    contexts_in_use: int = 0
    interrupted_contexts: int = 0
    suspends: int = 0
    lost_mmaps: int = 0
    lost_mmap_bytes: int = 0

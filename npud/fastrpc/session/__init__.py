"""FastRpcSession: one FastRPC session to the CDSP over a Driver. Synchronous; no trio.

Lifecycle::

    session = FastRpcSession.open(driver, library_path=[...])
    session.load_shell(verified_bytes)      # INIT_CREATE + the reverse-RPC listener
    handle = session.remote_open("file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0")
    result = session.invoke(handle, sc, inputs, outputs)
    session.close()

File descriptors. The session opens one fd on the CDSP node, ``rpc_fd``, for
everything: capabilities, allocation, process creation, mappings and invokes,
as libcdsprpc does. Each open of the node is one kernel session (one of the
channel's 12 compute context banks on X1E), so one fd per session leaves the
most DSP processes possible to npud's domains. The session owns that fd and
every DMA-BUF it allocates
itself (:meth:`alloc`, the shell, files it shares with the DSP), and lets go
of each exactly once.

Buffers of others. A DMA-BUF the session did not allocate (one from the
system heap, :mod:`npud.fastrpc.kernel.dma_heap`) can be mapped (:meth:`map`) and
passed in invokes just the same: the session keeps its DSP address of every
buffer it mapped, and counts itself as one of the buffer's holders
(``DmaBuffer.add_mapping``) until the mapping is undone or the session
closes, which drops every mapping at once.

Serialization rule. The kernel runs ioctls on one fd concurrently (libcdsprpc
invokes from many threads, and the listener sits in INVOKE on ``rpc_fd`` the
whole time), so the session does not serialize INVOKE. What it does
serialize, and why:

* INIT_CREATE runs once, under the process part's load lock (the kernel does not stop a
  second create on the same fd; the DSP's behaviour then is undefined).
* Mapping changes of one buffer (MEM_MAP, MEM_UNMAP, release) hold that
  buffer's ``lock``, so a buffer is never unmapped while being mapped.
* A buffer in use by an invoke is pinned; freeing it defers the release
  until the last such invoke returns, because the DSP may still touch it.
* ``close()`` waits for in-flight invokes: the kernel cannot release a file
  while a thread is inside an ioctl on it.

Allocation takes no lock that an invoke holds (the kernel runs ALLOC_DMA_BUFF
beside an INVOKE on the same fd), so an allocation never waits behind a long
invoke.

Signals: KernelDriver does not retry EINTR. Threads that call into the
session (the daemon's DSP lanes) block signals, so a signal never interrupts
an INVOKE that the DSP would then run anyway. Should one still come back
with EINTR (the suspend freezer), it fails with a DEVICE_ERROR that says the
DSP may have run it; the session never repeats it.

Stale mappings. Before linux-next the kernel finds a mapping by fd number
only. If a MEM_UNMAP fails (a DSP error, ETIMEDOUT), the kernel still holds
that mapping under the buffer's fd number; closing the fd would let a later
buffer that gets the same number alias the stale mapping (the DSP would
read and write the old buffer). So the session then keeps that fd open,
unmapped on the host, until it closes (``SessionStatistics.stale_fds``).

Errors that look like errnos. The kernel returns the DSP's result as the
ioctl's return value; one in -4095..-1 reaches us as an errno. An INVOKE
errno the kernel never produces (``errors.INVOKE_ERRNOS``) is therefore the
DSP's result and is returned as ``rc``; one it does produce is taken as the
kernel's (an ambiguity no userspace can resolve).


The session, by part (each a class that owns its state and gets the parts it uses at
construction; the facade makes them and delegates):

* ``_life``: the session's life (OPEN, CLOSING, CLOSED, moved along one table), the
  calls in flight that close waits for, the DSP's death, the DSP process's marks;
* ``_device``: the device node, and the session's fd with its ioctls, errnos translated;
* ``_mappings``: DSP mappings (MEM_MAP / MEM_UNMAP, stale mappings);
* ``_buffers``: DMA buffers (allocation, ownership, release);
* ``_invoke``: invoke and marshal (the INVOKE ioctl, its argument array, the suspends it
  waits through);
* ``_reverse_host``: heap growth and shared files for the reverse modules;
* ``_process``: the DSP process (the shell, INIT_CREATE, the listener, its end);
* ``_remotectl``: remotectl's calls packed and unpacked (the session's own interface
  to the DSP's loader, so it lives here rather than among the stubs above);
* ``_handles``: remotectl open / close and the invokes on remote handles;
* ``_trace``: what the session records of itself besides its driver calls (its
  operations, the listener's thread, the reverse calls): the driver calls themselves
  are recorded by the tracing Driver that wraps the real one;
* ``_statistics``: what a session reports;
* ``_session``: opening a session, and the FastRpcSession facade.
"""

from npud.fastrpc.session._handles import PROBED_STATIC_HANDLES
from npud.fastrpc.session._life import State
from npud.fastrpc.session._mappings import MAP_FLAGS
from npud.fastrpc.session._process import (
    CRASH_NOTICE_SECONDS,
    DEFAULT_PROCESS_ATTRS,
    EXIT_SC,
    LISTENER_JOIN_TIMEOUT,
)
from npud.fastrpc.session._session import FastRpcSession
from npud.fastrpc.session._statistics import SessionStatistics

__all__ = [
    "CRASH_NOTICE_SECONDS",
    "DEFAULT_PROCESS_ATTRS",
    "EXIT_SC",
    "LISTENER_JOIN_TIMEOUT",
    "MAP_FLAGS",
    "PROBED_STATIC_HANDLES",
    "FastRpcSession",
    "SessionStatistics",
    "State",
]

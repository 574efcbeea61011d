"""The DSP channel: one boot of the CDSP, what device fds are bound to.

A subsystem restart kills the channel object: fds opened on it stay bound to
the dead one (EPIPE from then on) and a boot creates a new channel with fresh
sessions, like the kernel's ``fastrpc_channel_ctx``. The channel's counters
are guarded by the driver's lock; ``down`` may be waited on without it.
"""

from __future__ import annotations

import threading
from typing import Final

from npud.sim.compute import Cancellation, SharedCompute
from npud.sim.errors import SubsystemDownError
from npud.sim.memory import HeapBuffer

FASTRPC_CTX_MAX: Final = 256
"""``idr_alloc_cyclic(&cctx->ctx_idr, ctx, 1, FASTRPC_CTX_MAX)``: context ids 1..255 per
channel, shared by every fd on it; with none free an INVOKE is ENOSPC."""
FASTRPC_CTX_IDS: Final = FASTRPC_CTX_MAX - 1


class Channel:
    def __init__(
        self, generation: int, sessions: int, dsp_units: int = 0, hmx_units: int = 0
    ) -> None:
        self.generation = generation
        self.alive = True
        self.down = threading.Event()
        self.compute = SharedCompute(dsp_units, self.down, hmx_units=hmx_units)
        """The DSP's execution units, shared by every call and every DSP process's own
        work (dspqueue batches) of this boot."""
        self.contexts = 0
        """Context ids taken: calls in flight and interrupted calls whose fds are open."""
        self.interrupted_mmaps: list[HeapBuffer] = []
        """MMAP buffers the kernel took from fds whose invoke a signal or the suspend
        freezer interrupted (``invoke_interrupted_mmaps``): never freed; a subsystem
        restart only unlinks them. Guarded by the driver's lock."""
        self.capabilities: tuple[int, ...] | None = None  # cached after the first query
        self._used = [False] * sessions

    def claim_session(self, limit: int) -> int | None:
        """The lowest free session index, None when ``limit`` sessions are in use."""
        if self.sessions_in_use >= limit:
            return None
        for index, used in enumerate(self._used):
            if not used:
                self._used[index] = True
                return index
        return None

    def release_session(self, index: int) -> None:
        self._used[index] = False

    @property
    def sessions_in_use(self) -> int:
        return sum(self._used)

    def claim_context(self) -> bool:
        """A context id for a call to the DSP; False when all 255 are taken."""
        if self.contexts >= FASTRPC_CTX_IDS:
            return False
        self.contexts += 1
        return True

    def release_context(self) -> None:
        self.contexts -= 1

    def release_contexts(self, count: int) -> None:
        """An fd is released: the contexts of its interrupted calls go."""
        self.contexts -= count

    def kill(self) -> None:
        """The DSP went down: wake every interruptible wait."""
        self.alive = False
        self.down.set()

    def work(self, seconds: float, cancelled: Cancellation | None = None) -> None:
        """Do ``seconds`` of DSP work, sharing the units with the calls running beside
        it; a subsystem restart cuts it short with SubsystemDownError, ``cancelled``
        (the process ended) with ProcessExitedError."""
        self.compute.work(seconds, cancelled)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; a subsystem restart cuts it short with SubsystemDownError."""
        if self.down.wait(seconds):
            raise SubsystemDownError

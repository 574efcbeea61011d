"""The one DSP and what every domain shares: the driver, the verified shell, memory.

There is one CDSP; each domain runs one DSP process on it (one FastRPC session).
What does not belong to any single process lives here, once:

* the Driver (the kernel's, or the emulator's) and the backend profile;
* the DSP shell, read and verified once at start: every domain loads exactly
  those verified bytes;
* the buffers handed to clients and the pool (:class:`~npud.domain.memory.Memory`),
  from the system DMA-BUF heap where there is one;
* the closer lane, which closes fds that peers sent (a close can block), and
  runs the pool's trimming;
* ``stopping``: set once at shutdown, read by every request.

Lives on the trio thread; its lanes run the blocking parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final

import structlog
import trio

from npud.domain.memory import Memory
from npud.fastrpc.kernel.dma_heap import DmaHeap
from npud.fastrpc.kernel.driver import Driver
from npud.fastrpc.trust.shell import VerifiedShell
from npud.ops.backend import Profile
from npud.ops.config import PoolConfig
from npud.runtime.closer import Closer
from npud.runtime.lanes import LanePool

log = structlog.get_logger("npud.device")

LANE_STOP_SECONDS: Final = 0.5
DEFAULT_MODEL_CHECK_SECONDS: Final = 10.0


class Device:
    """See the module docstring."""

    def __init__(self, profile: Profile, pool: PoolConfig) -> None:
        self.profile = profile
        self.driver: Driver = profile.make_driver()
        self.closer = LanePool("closer", 1)
        self.peer_fds = Closer()
        """Closes what peers sent, one thread per uid (npud/runtime/closer.py)."""
        self.shell: VerifiedShell | None = None
        self.memory: Memory | None = None
        self._pool_settings = pool
        self.stopping = False
        self.model_check_seconds: float | None = DEFAULT_MODEL_CHECK_SECONDS
        """How long one model file's checks may take (``[daemon] model_check_s``)."""
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._trimming = False

    @property
    def kind(self) -> str:
        """The backend: "kernel" or "emulator"."""
        return self.profile.kind

    async def start(self) -> None:
        """Start the closer lane, verify the shell, open the heap. Raises on failure."""
        self.closer.start()
        self.shell = await self.closer.call(self.profile.verify_shell)
        heap = await self.closer.call(lambda: DmaHeap.open(self.driver))
        self.memory = Memory(heap, self._pool_settings, on_filled=self._pool_filled)
        log.info(
            "memory ready",
            source=self.memory.source,
            heap=heap.path if heap is not None else None,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (the pool's idle trim) runs."""
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    async def close(self) -> None:
        """Let go of the pool and the heap, then of the driver (after every domain
        closed: the emulator ends its DSP processes' children), then stop the closer
        lane."""
        memory = self.memory
        if memory is not None:
            with contextlib.suppress(Exception):
                await self.closer.call(memory.close, timeout=5.0)
        try:
            await self.closer.call(self.driver.shutdown, timeout=5.0)
        except Exception as exc:  # shutting down: say so and go on
            log.warning("driver shutdown failed", error=repr(exc))
        if not await trio.to_thread.run_sync(self.closer.stop, LANE_STOP_SECONDS):
            log.warning("lane still busy at exit", lane=self.closer.name)
        await trio.to_thread.run_sync(self.peer_fds.close, LANE_STOP_SECONDS)

    def close_later(self, uid: int, fds: Sequence[int]) -> bool:
        """Close fds a peer of ``uid`` sent (owned from here) on that uid's closing thread
        (npud/runtime/closer.py): a close can block (SO_LINGER, FUSE). False when the uid has
        more waiting to be closed than the cap: drop the connection that sent them."""
        return self.peer_fds.submit(uid, fds)

    def stop_waiting(self) -> None:
        """Shutdown past its grace: nobody waits for the closer lane's jobs."""
        self.closer.stop_waiting()

    def require_memory(self) -> Memory:
        memory = self.memory
        assert memory is not None, "Device.start() comes first"
        return memory

    # --- the pool's idle trim ------------------------------------------------------------
    def _pool_filled(self) -> None:
        """The pool kept its first buffer (any thread): trim it from now until it is empty."""
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._start_trimming)

    def _start_trimming(self) -> None:
        if self._trimming or self._nursery is None or self.stopping:
            return
        self._trimming = True
        self._nursery.start_soon(self._trim_pool)

    async def _trim_pool(self) -> None:
        """Have the closer lane release what the pool kept too long, when it is due; ends
        when the pool is empty (the next buffer it keeps starts it again)."""
        pool = self.require_memory().pool
        try:
            while pool.holds() and not self.stopping:
                await trio.sleep(pool.next_trim_in())
                if pool.holds():
                    try:
                        await self.closer.call(pool.trim)  # one trim queued at a time
                    except Exception:
                        log.exception("trimming the buffer pool failed")
        finally:
            self._trimming = False

    def lanes(self) -> tuple[LanePool, ...]:
        return (self.closer,)

"""The emulated driver's PD children: its lease on a zygote and the children it spawned.

With ``SimConfig.pd_isolation="process"`` each DSP process runs its skels in a child
forked by a zygote (:mod:`npud.sim.pd_host`); :class:`PdSpawner` is what one
:class:`npud.sim.driver.EmulatedDriver` holds of them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

from npud.sim.config import SimConfig
from npud.sim.pd_child_handle import PdChild
from npud.sim.pd_host import PdSpawnError, ZygoteLease, acquire_zygote
from npud.sim.skels import SkelFactory


def skel_modules(skels: Mapping[str, SkelFactory]) -> tuple[str, ...]:
    """The modules outside npud where a PD child finds these skels' pickled factories:
    the zygote imports them before it confines itself, after which nothing is imported
    (npud's own skels are in the zygote's PRELOAD)."""
    modules = set()
    for factory in skels.values():
        function = getattr(factory, "func", factory)  # a functools.partial: its function
        module = getattr(function, "__module__", None)
        if isinstance(module, str) and module.split(".")[0] not in ("npud", "builtins"):
            modules.add(module)
    return tuple(sorted(modules))


class PdSpawner:
    """The driver's PD processes: its lease on the zygote and the children it spawned.

    Kept apart from the driver so that a finalizer can end them when the driver is
    garbage-collected without :meth:`EmulatedDriver.shutdown`."""

    def __init__(self, config: SimConfig) -> None:
        self._user = config.pd_user
        self._landlock = config.pd_landlock
        self._preload = skel_modules(config.skels)
        self._memory_limit = config.pd_memory_limit
        self._lock = threading.Lock()
        self._lease: ZygoteLease | None = None
        self._children: weakref.WeakSet[PdChild] = weakref.WeakSet()

    def start(self) -> None:
        """Take a lease on the zygote (which starts in the background if no one runs it)."""
        with self._lock:
            if self._lease is None:
                self._lease = acquire_zygote(
                    self._user, landlock=self._landlock, preload=self._preload
                )

    def spawn(self) -> PdChild:
        self.start()
        with self._lock:
            lease = self._lease
        if lease is None:  # pragma: no cover - shut down meanwhile
            raise PdSpawnError("the driver was shut down")
        child = lease.spawn(self._memory_limit)
        with self._lock:
            self._children.add(child)
        return child

    def close(self) -> None:
        """Kill every child still alive and give the zygote back. Idempotent."""
        with self._lock:
            children = list(self._children)
            self._children = weakref.WeakSet()
            lease, self._lease = self._lease, None
        for child in children:
            child.kill()
        if lease is not None:
            lease.release()

"""The kernel's state for one open of a FastRPC node, and for one call waiting on the DSP.

:class:`DeviceFile` mirrors ``struct fastrpc_user`` and :class:`PendingCall` a user
call's ``fastrpc_invoke_ctx``; :class:`npud.sim.driver.EmulatedDriver` keeps them
under its lock.
"""

from __future__ import annotations

import dataclasses

from npud.sim.channel import Channel
from npud.sim.process import DspProcess


@dataclasses.dataclass(eq=False)
class PendingCall:
    """One INVOKE waiting for the DSP: the kernel's ``fastrpc_invoke_ctx`` of a user call."""

    device: DeviceFile
    holds_context: bool = True
    """It holds a context id of the channel (False: a suspend took it, and no id was free
    for the restarted call)."""
    interrupted: int = 0
    """Suspends that ended its wait: each leaked the context it held (kept until the fd
    is released) and restarted the call under a new one."""


@dataclasses.dataclass(eq=False)
class DeviceFile:
    """One open of a device node: the kernel's ``struct fastrpc_user``."""

    fd: int
    path: str
    secure: bool
    channel: Channel
    session: int
    process: DspProcess | None = None
    active_ioctls: int = 0
    closed: bool = False
    released: bool = False
    interrupted_contexts: int = 0
    """Contexts of this fd's interrupted invokes: mainline keeps each on the fd's pending
    list, holding its context id, until the fd is released."""

    @property
    def client_id(self) -> int:
        return self.session + 1

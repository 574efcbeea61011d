"""The simulated DSP's calls into the host: reverse RPC to the modules the host serves.

The DSP reaches a host module (``apps_std``, ``apps_mem``) the way the real
one does: it opens the module by name through ``apps_remotectl`` (reverse
handle 0, method 0, sc 0x00020200, the remotectl open layout of
``idl/remotectl.idl``, through :mod:`npud.idl`) once per process, and
calls the handle it got back. Every call is one request on the process's
reverse-RPC queue, served by the session's listener thread
(:mod:`npud.sim.reverse`); it runs on the caller's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Final

from npu_protocol.aee import describe_result
from npud import idl
from npud.sim.errors import ReverseTimeoutError
from npud.sim.reverse import ReverseReply, ReverseRpc

APPS_REMOTECTL_HANDLE: Final = 0
REMOTECTL_OPEN: Final = idl.load("remotectl").method("open")
DLERROR_CAPACITY: Final = 256


class HostCallError(Exception):
    """A host module could not be reached: no listener, no answer, or the open failed.

    ``str()`` says what happened, without naming the caller's file (the caller adds it).
    """


def c_string(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def text_of(buffer: bytes) -> str:
    return buffer.split(b"\0", 1)[0].decode("utf-8", errors="replace")


class HostChannel:
    """Reverse calls of one DSP process, and the handles of the host modules it opened."""

    def __init__(self, reverse: ReverseRpc, timeout: float) -> None:
        self._reverse = reverse
        self._timeout = timeout
        self._lock = threading.Lock()
        self._modules: dict[str, int] = {}

    def call(
        self, handle: int, sc: int, inputs: Sequence[bytes], caps: Sequence[int]
    ) -> ReverseReply:
        """One reverse call. HostCallError when no listener answers in time;
        SubsystemDownError / ProcessExitedError pass through."""
        try:
            return self._reverse.call(handle, sc, inputs, caps, self._timeout)
        except ReverseTimeoutError as exc:
            if exc.picked_up:
                raise HostCallError("the reverse-RPC listener did not answer") from None
            raise HostCallError("no reverse-RPC listener") from None

    def module(self, name: str) -> int:
        """The handle of host module ``name``, opened on first use (concurrent users wait)."""
        with self._lock:
            handle = self._modules.get(name)
            if handle is None:
                handle = self._modules[name] = self._open(name)
            return handle

    def _open(self, name: str) -> int:
        call = REMOTECTL_OPEN.encode(name=name, dlerror=DLERROR_CAPACITY)
        inputs = [item for item in call.inputs if isinstance(item, bytes)]
        capacities = [item for item in call.outputs if isinstance(item, int)]
        reply = self.call(APPS_REMOTECTL_HANDLE, call.sc, inputs, capacities)
        if reply.result:
            raise HostCallError(f"host {name} open failed with {describe_result(reply.result)}")
        try:
            values = REMOTECTL_OPEN.decode(reply.outputs)
        except idl.MarshalError as exc:
            raise HostCallError(f"host {name} open: the reply does not fit: {exc}") from None
        if values.integer("nErr"):
            raise HostCallError(f"host {name} open failed: {text_of(reply.outputs[1])}")
        return values.integer("handle")

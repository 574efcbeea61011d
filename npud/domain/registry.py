"""What one domain holds on the DSP, counted: buffer mappings, remote handles, models.

Objects that several holders share live here once, with a count; a holder
keeps a *lease* (an object naming the entry), never the DSP object itself.
The last lease released undoes the DSP side:

* a **mapping** of a DMA-BUF into the domain's DSP process: the first lease
  makes the MEM_MAP, the last one the MEM_UNMAP. A client's ``map`` takes a
  lease; so does the buffer pool when it keeps a buffer mapped;
* a **remote handle** (one per remotectl open: a count of one);
* a **model load** shared by the clients of the domain that load the same
  model (the same bytes and the same shapes): the weights are held once.

A restart of the domain's DSP process (its session) ends every lease at once:
:meth:`Registry.forget_all` starts a new *generation*, the old session's close
undoes its mappings with the process, and a lease of an earlier generation is
dead: releasing it does nothing.

Threads: the MEM_MAP and MEM_UNMAP run on the caller's thread (the domain's
control lane), :meth:`Registry.release_later` queues the unmap there; the
tables are guarded by one lock, never held across a DSP call.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.abi import FASTRPC_MAP_FD
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session import FastRpcSession

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class MappingLease:
    """One holder's share of a buffer's mapping into the domain's DSP process."""

    registry: Registry
    generation: int
    buffer: DmaBuffer
    address: int
    released: bool = False

    @property
    def valid(self) -> bool:
        """Still a mapping of the live DSP process (no restart since it was taken)."""
        return not self.released and self.generation == self.registry.generation

    def release_later(self, then: Callable[[], None] | None = None) -> None:
        """Give the lease back on the domain's control lane, then call ``then`` there."""
        self.registry.release_later(self, then)


@dataclasses.dataclass(eq=False)
class _Mapping:
    address: int
    leases: int


@dataclasses.dataclass(eq=False)
class Shared(Generic[T]):
    """One object held once for several leases (a model load shared by clients)."""

    key: Hashable
    value: T
    generation: int
    leases: int = 1


@dataclasses.dataclass(frozen=True)
class RegistryStatistics:
    mappings: int
    mapped_bytes: int
    mapping_leases: int
    handles: int
    shared: int
    shared_leases: int
    generation: int


class Registry:
    """See the module docstring. One per domain."""

    def __init__(
        self,
        control: Callable[[Callable[[], None]], None],
        session: Callable[[], FastRpcSession | None],
    ) -> None:
        """``control(job)`` runs ``job`` on the domain's control lane; ``session()`` is the
        domain's live session (None while it restarts)."""
        self._control = control
        self._session = session
        self._lock = threading.Lock()
        self.generation = 1
        self._mappings: dict[DmaBuffer, _Mapping] = {}
        self._handles: set[int] = set()
        self._shared: dict[Hashable, Shared[object]] = {}

    # --- mappings (on the control lane) -----------------------------------------------
    def map(
        self, session: FastRpcSession, buffer: DmaBuffer, flags: int = FASTRPC_MAP_FD
    ) -> MappingLease:
        """A lease on ``buffer``'s mapping; the first one maps it (MEM_MAP with ``flags``;
        later leases share that mapping whatever they ask). Raises the session's error
        (nothing is held then)."""
        with self._lock:
            generation = self.generation
            entry = self._mappings.get(buffer)
            if entry is not None:
                entry.leases += 1
                return MappingLease(self, generation, buffer, entry.address)
        address = session.map(buffer, flags)  # idempotent: a concurrent first lease maps once
        with self._lock:
            if generation != self.generation:  # a restart meanwhile: that mapping is gone
                raise RpcError(ErrorCode.DSP_RESTARTED)
            entry = self._mappings.get(buffer)
            if entry is None:
                entry = self._mappings[buffer] = _Mapping(address, 0)
            entry.leases += 1
        return MappingLease(self, generation, buffer, address)

    def unmap(self, session: FastRpcSession | None, lease: MappingLease, *, going: bool) -> None:
        """Give ``lease`` back; the last one unmaps the buffer (MEM_UNMAP).

        ``going``: the buffer is being let go. A failed MEM_UNMAP then leaves the
        kernel's mapping to the session, which keeps the buffer's fd open until it
        closes, and is raised; otherwise (a client's ``unmap``) the lease stays valid
        and the failure is raised (the buffer stays mapped and usable).
        """
        with self._lock:
            if not lease.valid:
                lease.released = True
                return
            entry = self._mappings[lease.buffer]
            entry.leases -= 1
            if entry.leases:
                lease.released = True
                return
            del self._mappings[lease.buffer]
            lease.released = True
        if session is None:
            return  # no process: nothing is mapped any more
        try:
            session.unmap(lease.buffer, going=going)
        except RpcError:
            if not going:
                with self._lock:  # still mapped: the lease holds it again
                    if lease.generation == self.generation:
                        self._mappings[lease.buffer] = _Mapping(lease.address, 1)
                        lease.released = False
            raise

    def release_later(self, lease: MappingLease, then: Callable[[], None] | None) -> None:
        """:meth:`unmap` (``going``) of ``lease`` on the control lane, then ``then()``."""
        self._control(lambda: self._release_now(lease, then))

    def _release_now(self, lease: MappingLease, then: Callable[[], None] | None) -> None:
        try:
            if lease.valid:
                self.unmap(self._session(), lease, going=True)
        except RpcError:
            pass  # logged by the session; the mapping stays with it until it closes
        finally:
            if then is not None:
                then()

    # --- remote handles -----------------------------------------------------------------
    def opened(self, handle: int) -> int:
        """Record a handle from remotectl open; returns the generation it belongs to."""
        with self._lock:
            self._handles.add(handle)
            return self.generation

    def closed(self, handle: int, generation: int) -> bool:
        """Forget ``handle``; False when it is of an earlier generation (gone already)."""
        with self._lock:
            if generation != self.generation:
                return False
            self._handles.discard(handle)
            return True

    # --- shared objects (model loads) -----------------------------------------------------
    def acquire(self, key: Hashable) -> Shared[object] | None:
        """A new lease on the live object under ``key``, or None when there is none."""
        with self._lock:
            entry = self._shared.get(key)
            if entry is None:
                return None
            entry.leases += 1
            return entry

    def share(self, key: Hashable, value: T) -> Shared[T]:
        """Record ``value`` under ``key`` with one lease (the caller's). A concurrent load
        of the same key that got there first wins: its entry is returned with a lease,
        and the caller releases its own ``value``."""
        with self._lock:
            existing = self._shared.get(key)
            if existing is not None:
                existing.leases += 1
                return existing  # type: ignore[return-value]
            entry = Shared(key, value, self.generation)
            self._shared[key] = entry  # type: ignore[assignment]
            return entry

    def give_back(self, entry: Shared[T]) -> bool:
        """Release one lease of ``entry``; True when it was the last (the caller unloads
        the object). False, too, for an entry of an earlier generation (gone already)."""
        with self._lock:
            if entry.generation != self.generation:
                return False
            entry.leases -= 1
            if entry.leases:
                return False
            if self._shared.get(entry.key) is entry:
                del self._shared[entry.key]
            return True

    # --- the whole registry -------------------------------------------------------------------
    def forget_all(self) -> None:
        """The DSP process is gone (a restart, the domain's end): every lease ends."""
        with self._lock:
            self.generation += 1
            self._mappings.clear()
            self._handles.clear()
            self._shared.clear()

    def statistics(self) -> RegistryStatistics:
        with self._lock:
            return RegistryStatistics(
                mappings=len(self._mappings),
                mapped_bytes=sum(buffer.size for buffer in self._mappings),
                mapping_leases=sum(m.leases for m in self._mappings.values()),
                handles=len(self._handles),
                shared=len(self._shared),
                shared_leases=sum(s.leases for s in self._shared.values()),
                generation=self.generation,
            )

"""Every domain of the daemon: the default one, named shared ones, isolated ones.

* The **default** domain is opened at start (npud is ready once it is up) and
  serves every connection no rule takes.
* A **named** shared domain is opened at the Hello of its first connection and
  kept until npud stops.
* An **isolated** domain is opened at a connection's Hello, for it alone, and
  closed when it goes.

At most ``domains.max_domains`` DSP processes are kept at once, the default
domain's included: a connection that would need one more is refused with
QUOTA_EXCEEDED, and one the device itself has no session for (another program
holds the context banks) with NO_FREE_SESSION.

Lives on the trio thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import structlog
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.config import DEFAULT_DOMAIN, DomainsConfig
from npud.domain.device import Device
from npud.domain.life import Domain
from npud.domain.placement import Placement, place

log = structlog.get_logger("npud.domains")

DOMAIN_RESOURCE: Final = "DSP processes (domains)"


class Domains:
    """See the module docstring."""

    def __init__(
        self,
        device: Device,
        config: DomainsConfig,
        *,
        on_restarted: Callable[[Domain, str], None],
        on_reopened: Callable[[Domain, str], Awaitable[None]],
    ) -> None:
        self.device = device
        self.config = config
        self._on_restarted = on_restarted
        self._on_reopened = on_reopened
        self._domains: dict[str, Domain] = {}
        self._opening: dict[str, trio.Event] = {}
        self._isolated_serial = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.default: Domain | None = None

    def __iter__(self) -> Iterator[Domain]:
        return iter(list(self._domains.values()))

    def __len__(self) -> int:
        return len(self._domains)

    def get(self, name: str) -> Domain | None:
        return self._domains.get(name)

    def _make(self, name: str, *, isolated: bool) -> Domain:
        return Domain(
            self.device,
            name,
            isolated=isolated,
            on_restarted=self._on_restarted,
            on_reopened=self._on_reopened,
        )

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Open the default domain (raises when the DSP cannot be brought up)."""
        domain = self._make(DEFAULT_DOMAIN, isolated=False)
        self._domains[domain.name] = domain
        try:
            await domain.start()
        except BaseException:
            del self._domains[domain.name]
            raise
        self.default = domain

    def attach(self, nursery: trio.Nursery) -> None:
        """Where domains run their recovery, and new domains are started, from now on."""
        self._nursery = nursery
        for domain in self:
            domain.attach(nursery)

    async def close(self, grace: float) -> None:
        """Close every domain at once; calls still on the DSP get ``grace`` seconds."""
        async with trio.open_nursery() as nursery:
            for domain in self:
                nursery.start_soon(domain.close, grace)
        self._domains.clear()

    def stop_waiting(self) -> None:
        for domain in self:
            domain.stop_waiting()

    def check_sessions(self) -> None:
        for domain in self:
            domain.check_session()

    def check_interrupted(self) -> None:
        """After a system suspend: when npud's sessions hold
        ``reopen_at_interrupted_contexts`` contexts of interrupted calls together, reopen
        those holding the most until they hold half as many (mainline frees an
        interrupted call's context only when its fd closes, and at 255 on the channel
        every call of every program on the CDSP fails)."""
        limit = self.config.reopen_at_interrupted_contexts
        held = {domain: domain.interrupted_contexts for domain in self}
        total = sum(held.values())
        if total < limit:
            return
        for domain in sorted(held, key=held.__getitem__, reverse=True):
            if total < max(limit // 2, 1) or held[domain] == 0:
                break
            domain.reopen_for_suspends(held[domain], total, limit)
            total -= held[domain]

    # --------------------------------------------------------------- joining
    def placement(self, uid: int, groups: tuple[int, ...], client_name: str) -> Placement:
        return place(self.config, uid, groups, client_name)

    async def join(self, placement: Placement, member: object) -> Domain:
        """The domain ``member`` (a client, at its Hello) joins, opened if need be.

        Raises QUOTA_EXCEEDED when ``max_domains`` are open, NO_FREE_SESSION when
        the device has no free session, DSP_RESTARTED / SHUTTING_DOWN as a request
        would, and the session's error when the new DSP process cannot be started.
        """
        if self.device.stopping:
            raise CodedError(ErrorCode.SHUTTING_DOWN)
        if placement.isolate:
            name = f"{placement.name}#{next(self._isolated_serial)}"
            domain = await self._open(name, isolated=True)
        else:
            domain = await self._shared(placement.name)
        domain.members.add(member)
        return domain

    async def _shared(self, name: str) -> Domain:
        while True:
            domain = self._domains.get(name)
            if domain is not None and domain.state != "closed":
                return domain
            opening = self._opening.get(name)
            if opening is None:
                break
            await opening.wait()  # another Hello is opening it: take what it made
        done = self._opening[name] = trio.Event()
        try:
            return await self._open(name, isolated=False)
        finally:
            del self._opening[name]
            done.set()

    async def _open(self, name: str, *, isolated: bool) -> Domain:
        if len(self._domains) >= self.config.max_domains:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED,
                resource=DOMAIN_RESOURCE,
                limit=self.config.max_domains,
            )
        assert self._nursery is not None, "Domains.attach() comes first"
        domain = self._make(name, isolated=isolated)
        self._domains[name] = domain  # counted while it opens
        try:
            await domain.start()
            domain.attach(self._nursery)
        except BaseException as exc:
            del self._domains[name]
            if isinstance(exc, CodedError):
                log.warning("domain not opened", domain=name, code=exc.code.name, error=str(exc))
            raise
        return domain

    async def leave(self, domain: Domain, member: object, grace: float = 5.0) -> None:
        """``member`` is gone (its objects already released): an isolated domain closes."""
        domain.members.discard(member)
        if domain.isolated and not domain.members:
            # Counted until its session is closed: its context bank is not free before.
            with trio.CancelScope(shield=True):
                await domain.close(grace)
            if self._domains.get(domain.name) is domain:
                del self._domains[domain.name]

    # ----------------------------------------------------------------- status
    def rows(self) -> tuple[p.DomainRow, ...]:
        return tuple(domain.row(len(domain.members)) for domain in self)

"""Every domain of the daemon: the default one, per-user ones, named shared ones,
isolated ones (which connection goes where: :mod:`npud.domain.placement`).

* The **default** domain is opened at start (npud is ready once it is up) and
  serves the privileged users' connections that no rule takes (root's, npud's
  own), or everyone's with ``share_default``.
* A **per-user** domain (``default@UID``, ``NAME@UID``) is opened at the Hello
  of the user's first connection that goes there and closed
  ``user_domain_linger_s`` after its last one goes, unless a connection joined
  it meanwhile: a user who left holds no DSP process for long, and one that
  connects and disconnects in a loop does not make npud start and stop one
  each time.
* A **named** domain several users share (``share = "all"``, or the privileged
  users' ``NAME``) is opened at the Hello of its first connection and kept
  until npud stops.
* An **isolated** domain is opened at a connection's Hello, for it alone, and
  closed when it goes.

At most ``domains.max_domains`` DSP processes are kept at once, the default
domain's included, and at most ``max_domains_per_uid`` of one user (its
per-user and isolated ones; not the privileged users'): a connection that
would need one more is refused with QUOTA_EXCEEDED naming the limit and the
uid, and one the device itself has no session for (another program holds the
context banks) with NO_FREE_SESSION. A domain being closed counts until its
session is: its context bank is not free before.

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
from npud.domain.device import Device
from npud.domain.life import Domain
from npud.domain.placement import Placement, place
from npud.ops.config import DEFAULT_DOMAIN, DomainsConfig

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
        """The domains a connection may join, by name."""
        self._closing: list[Domain] = []
        """Domains whose sessions are being closed: still counted, joined by no one."""
        self._opening: dict[str, trio.Event] = {}
        self._isolated_serial = itertools.count(1)
        self._lingering: dict[Domain, object] = {}
        """Per-user domains their last member left, each with the token of its linger:
        a join takes it out, so only the linger of the latest departure closes it."""
        self._nursery: trio.Nursery | None = None
        self.default: Domain | None = None

    def __iter__(self) -> Iterator[Domain]:
        return iter([*self._domains.values(), *self._closing])

    def __len__(self) -> int:
        return len(self._domains) + len(self._closing)

    def owned_by(self, uid: int) -> int:
        """DSP processes counted against ``uid``'s ``max_domains_per_uid`` now."""
        return sum(domain.owner == uid for domain in self)

    def get(self, name: str) -> Domain | None:
        return self._domains.get(name)

    def _make(self, name: str, *, isolated: bool, owner: int | None = None) -> Domain:
        return Domain(
            self.device,
            name,
            isolated=isolated,
            owner=owner,
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
            for domain in list(self._domains.values()):  # the closing ones close in leave()
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
    def placement(
        self, uid: int, groups: tuple[int, ...], client_name: str, privileged: frozenset[int]
    ) -> Placement:
        return place(self.config, uid, groups, client_name, privileged)

    async def join(self, placement: Placement, member: object) -> Domain:
        """The domain ``member`` (a client, at its Hello) joins, opened if need be.

        Raises QUOTA_EXCEEDED when ``max_domains`` are open, or ``max_domains_per_uid``
        of the placement's owner, NO_FREE_SESSION when the device has no free session,
        DSP_RESTARTED / SHUTTING_DOWN as a request would, and the session's error when
        the new DSP process cannot be started.
        """
        if self.device.stopping:
            raise CodedError(ErrorCode.SHUTTING_DOWN)
        if placement.isolate:
            name = f"{placement.name}#{next(self._isolated_serial)}"
            domain = await self._open(name, isolated=True, owner=placement.owner)
        else:
            domain = await self._shared(placement.name, placement.owner)
        domain.members.add(member)
        self._lingering.pop(domain, None)  # rejoined: its linger, if any, closes nothing
        return domain

    async def _shared(self, name: str, owner: int | None) -> Domain:
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
            return await self._open(name, isolated=False, owner=owner)
        finally:
            del self._opening[name]
            done.set()

    async def _open(self, name: str, *, isolated: bool, owner: int | None) -> Domain:
        if len(self) >= self.config.max_domains:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED,
                resource=DOMAIN_RESOURCE,
                limit=self.config.max_domains,
            )
        if owner is not None and self.owned_by(owner) >= self.config.max_domains_per_uid:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED,
                resource=f"{DOMAIN_RESOURCE} of uid {owner}",
                limit=self.config.max_domains_per_uid,
            )
        assert self._nursery is not None, "Domains.attach() comes first"
        domain = self._make(name, isolated=isolated, owner=owner)
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
        """``member`` is gone (its objects already released): an isolated domain closes,
        and so does a user's own domain that it was the last in, ``user_domain_linger_s``
        later unless a connection joins it meanwhile."""
        domain.members.discard(member)
        if domain.members or not (domain.isolated or domain.owner is not None):
            return
        if self._domains.get(domain.name) is not domain:
            return  # closing already
        linger = 0.0 if domain.isolated else self.config.user_domain_linger_s
        if linger > 0 and self._nursery is not None and not self.device.stopping:
            token = self._lingering[domain] = object()
            self._nursery.start_soon(self._linger, domain, token, linger, grace)
            return
        await self._close(domain, grace)

    async def _linger(self, domain: Domain, token: object, linger: float, grace: float) -> None:
        """Close ``domain`` ``linger`` seconds from now, unless it was joined meanwhile (its
        token gone or replaced by a later departure's). Cancelled when npud stops, whose
        close() closes it with the others."""
        try:
            await trio.sleep(linger)
        finally:
            still = self._lingering.get(domain) is token
            if still:
                del self._lingering[domain]
        if still and not domain.members and self._domains.get(domain.name) is domain:
            await self._close(domain, grace)

    async def _close(self, domain: Domain, grace: float) -> None:
        # Joined by no one from now on (the next Hello opens a new one), but counted
        # until its session is closed: its context bank is not free before.
        del self._domains[domain.name]
        self._closing.append(domain)
        try:
            with trio.CancelScope(shield=True):
                await domain.close(grace)
        finally:
            self._closing.remove(domain)

    # ----------------------------------------------------------------- status
    def rows(self, viewer_uid: int | None = None) -> tuple[p.DomainRow, ...]:
        """Every domain's row; with ``viewer_uid``, only those it may see: the shared
        ones and its own (another user's domains name that user)."""
        return tuple(
            domain.row(len(domain.members))
            for domain in self
            if viewer_uid is None or domain.owner in (None, viewer_uid)
        )

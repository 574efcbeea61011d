"""Per-client state: identity, the table of what a connection owns, and quotas.

Every object a client creates (a buffer, a skel handle, a model) gets an id from one
space per connection: ids start at 1 and are never reused, so an id names one
object for the connection's whole life, and another connection's ids mean
nothing here.

Arrival order. The :class:`ObjectTable` is consulted when a request *arrives*,
in the order the requests arrived, not when it runs. So a pipelined client can
rely on order:

* a creating request (alloc, open) reserves its id at arrival; a later request
  naming that id waits until the object exists (or fails with "unknown" if the
  creation failed);
* a request that uses an object (an invoke naming a buffer or a handle, a map)
  holds it from arrival until it ends;
* a destroying request (free, close) marks the object at arrival, so later
  requests naming it are refused as unknown, and takes effect only when every
  earlier request holding it has ended: its reply comes after theirs.

The table is shared by the trio thread and the threads that run DSP calls, so
it is guarded by a lock; what waits for an object registers a callback on its
:class:`Gate`, run by the thread that opens it (the data path then carries the
request on). Nothing here imports trio.
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.ops.config import Config
from npud.requests.holdings import HeldBuffer
from npud.runtime.scheduler import Account

if TYPE_CHECKING:
    pass


def _bank_lost(entry: Entry) -> bool:
    value = entry.value
    return isinstance(value, HeldBuffer) and value.buffer.bank_lost


class Gate:
    """Opens once; callbacks registered before run on the opening thread."""

    __slots__ = ("_callbacks", "_lock", "_open")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        with self._lock:
            if self._open:
                return
            self._open = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _when_open(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the gate opens; False (and no call) if it already is."""
        with self._lock:
            if self._open:
                return False
            self._callbacks.append(callback)
            return True

    def when_open(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the gate is open: now if it is, else on the opening thread."""
        if not self._when_open(callback):
            callback()


class Kind(enum.Enum):
    """What an id names; the error for an id of the wrong kind names the kind asked for."""

    BUFFER = "buffer"
    HANDLE = "handle"
    MODEL = "model"

    @property
    def unknown(self) -> ErrorCode:
        return _UNKNOWN[self]


_UNKNOWN = {
    Kind.BUFFER: ErrorCode.UNKNOWN_BUFFER,
    Kind.HANDLE: ErrorCode.UNKNOWN_HANDLE,
    Kind.MODEL: ErrorCode.MODEL_NOT_LOADED,
}


@dataclass(eq=False)
class Entry:
    """One object of a connection, from the arrival of the request that creates it."""

    kind: Kind
    id: int
    size: int = 0
    """Bytes counted against the quotas (buffers; models: file plus arena)."""
    value: Any = None
    """The session's object once created: a DmaBuffer, a DSP handle (int), or a
    model (npud.requests.models.NpuModel)."""
    created: Gate = field(default_factory=Gate)
    """Open once the creating request has ended, whether it succeeded or not."""
    live: bool = False
    lost: bool = False
    """Released by a session restart (requests naming it get DSP_RESTARTED)."""
    doomed: bool = False
    """A destroying request has arrived: the id is unknown to later requests."""
    users: int = 0
    """Requests that named this object, have arrived and have not ended."""
    idle: Gate | None = None
    """For the destroying request: opens when ``users`` drops to zero."""


class ObjectTable:
    """One connection's buffers and handles, in one id space, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._next_id = 1
        self._lost_below = 1  # ids below this were released by a session restart

    # --- at arrival (the request's order on the connection) ------------------
    def reserve(self, kind: Kind, size: int = 0) -> Entry:
        """A new id for an object that a request is about to create."""
        with self._lock:
            entry = Entry(kind, self._next_id, size)
            self._next_id += 1
            self._entries[entry.id] = entry
            return entry

    def skip_id(self) -> None:
        """A creating request was refused before it reserved: its id is taken all the same."""
        with self._lock:
            self._next_id += 1

    def use(self, object_id: int, kind: Kind) -> Entry:
        """Hold ``object_id`` for a request until :meth:`done_with`; raises if unknown."""
        with self._lock:
            entry = self._find(object_id, kind)
            entry.users += 1
            return entry

    def doom(self, object_id: int, kind: Kind) -> Entry:
        """Mark ``object_id`` for destruction; later requests no longer find it."""
        with self._lock:
            entry = self._find(object_id, kind)
            entry.doomed = True
            if entry.users:
                entry.idle = Gate()
            return entry

    # --- as requests end -------------------------------------------------------
    def done_with(self, entry: Entry) -> None:
        """A request that held ``entry`` has ended."""
        with self._lock:
            entry.users -= 1
            idle = entry.idle if entry.users == 0 else None
        if idle is not None:
            idle.open()

    def created(self, entry: Entry, value: object) -> bool:
        """The creating request succeeded: ``entry`` now stands for ``value``.

        False when the table no longer has the entry (the connection ended or
        the session restarted meanwhile): the caller still owns ``value`` and
        releases it.
        """
        with self._lock:
            entry.value = value
            entry.live = self._entries.get(entry.id) is entry
        entry.created.open()
        return entry.live

    def failed(self, entry: Entry) -> None:
        """The creating request failed: the id names nothing."""
        self.remove(entry)
        entry.created.open()

    def remove(self, entry: Entry) -> None:
        with self._lock:
            if self._entries.get(entry.id) is entry:
                del self._entries[entry.id]
            entry.live = False

    # --- the whole table --------------------------------------------------------
    def forget_dsp_objects(self, *, keep_buffers: bool) -> list[Entry]:
        """The client's DSP process restarted: every handle and model issued so far is
        gone (DSP_RESTARTED, not unknown, for requests naming one). Buffers live on
        outside the DSP: with ``keep_buffers`` (protocol version 3) they stay, unmapped;
        otherwise they go too, and so does any buffer whose compute bank the restart
        removed (ALLOC_DMA_BUFF, no system heap). Returns the live entries that went,
        for release."""
        with self._lock:
            gone = [
                entry
                for entry in self._entries.values()
                if not (keep_buffers and entry.kind is Kind.BUFFER and not _bank_lost(entry))
            ]
            for entry in gone:
                del self._entries[entry.id]
            self._lost_below = self._next_id
            kept = [entry for entry in self._entries.values() if entry.kind is Kind.BUFFER]
        for entry in kept:
            if isinstance(entry.value, HeldBuffer):
                entry.value.mapping = None  # its lease died with the process
        released = [entry for entry in gone if entry.live]
        for entry in gone:
            entry.live = False
            entry.lost = True
            entry.created.open()
            if entry.idle is not None:
                entry.idle.open()
        return released

    def take_all(self) -> list[Entry]:
        """Empty the table (the connection ended); the live entries, for release."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._lost_below = self._next_id
        for entry in entries:
            entry.created.open()
        return [entry for entry in entries if entry.live]

    def entries(self, kind: Kind) -> Iterator[Entry]:
        """Live entries of ``kind`` (a snapshot)."""
        with self._lock:
            snapshot = list(self._entries.values())
        return (e for e in snapshot if e.kind is kind and e.live)

    def pending(self, kind: Kind) -> tuple[int, int]:
        """(count, bytes) of ``kind`` counted against the quotas: live or being created."""
        with self._lock:
            counted = [e for e in self._entries.values() if e.kind is kind]
        return len(counted), sum(e.size for e in counted)

    def _find(self, object_id: int, kind: Kind) -> Entry:
        entry = self._entries.get(object_id)
        if entry is None or entry.doomed:
            if entry is None and object_id < self._lost_below and object_id >= 1:
                raise CodedError(ErrorCode.DSP_RESTARTED)
            raise unknown(kind, object_id)
        if entry.kind is not kind:
            raise unknown(kind, object_id)
        return entry


def unknown(kind: Kind, object_id: int) -> CodedError:
    return CodedError(kind.unknown, **{kind.value: object_id})


@dataclass(eq=False)
class Client:
    """One connection's view of the NPU."""

    pid: int
    uid: int
    gid: int
    name: str = "?"
    groups: tuple[int, ...] = ()
    """Every group of the peer (primary and supplementary, from SO_PEERGROUPS)."""
    priority: p.Priority = p.Priority.NORMAL
    protocol_version: int = p.PROTOCOL_VERSION
    """The version agreed at Hello."""
    domain_name: str = ""
    """The domain its calls run in (set at Hello)."""
    watch_only: bool = False
    """Its Hello said it only watches (hello.watch): it has no DSP process, and requests
    that take DSP resources are refused."""
    hung_calls: int = 0
    """Calls of this client the watchdog caught."""
    limits: p.ClientLimits | None = None
    """What its Welcome announced (a reload makes them anew); every call checks them."""
    quotas: Clients | None = None
    """The table it was admitted to, whose quotas span clients (set by Clients.admit)."""
    send_event: Callable[[p.ServerEvent], object] | None = None
    """How events reach this client (set once it is welcomed; never blocks)."""
    account: Account | None = None
    """The scheduler's view of this client (set once it is welcomed)."""
    objects: ObjectTable = field(default_factory=ObjectTable)
    calls_in_flight: int = 0
    calls_done: int = 0
    waits: int = 0
    """Its calls that wait for the DSP now (invoke with ``wait``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_call(self, limit: int) -> None:
        """One more DSP call arrived; refused past ``limit`` unanswered ones."""
        with self._lock:
            if self.calls_in_flight >= limit:
                raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="calls in flight", limit=limit)
            self.calls_in_flight += 1

    def end_call(self) -> None:
        with self._lock:
            self.calls_in_flight -= 1
            self.calls_done += 1

    def begin_wait(self, limit: int) -> None:
        """One more call that waits for the DSP; refused past ``limit`` at once."""
        with self._lock:
            if self.waits >= limit:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource="calls waiting for the DSP", limit=limit
                )
            self.waits += 1

    def end_wait(self) -> None:
        with self._lock:
            self.waits -= 1

    @property
    def buffer_bytes(self) -> int:
        return sum(entry.size for entry in self.objects.entries(Kind.BUFFER))

    @property
    def pools_freed_buffers(self) -> bool:
        """What it frees may go to the pool and to its next holder (protocol version 2:
        a client closes its fd and mapping once ``free`` is answered)."""
        return p.speaks(self.protocol_version, p.Feature.FREED_MEMORY_REUSED)

    @property
    def keeps_buffers(self) -> bool:
        """A restart of its domain leaves its buffers alone (protocol version 3)."""
        return p.speaks(self.protocol_version, p.Feature.BUFFERS_OUTLIVE_RESTARTS)

    def row(self) -> p.ClientRow:
        buffers = list(self.objects.entries(Kind.BUFFER))
        models = [entry.value.row(entry.id) for entry in self.objects.entries(Kind.MODEL)]
        account = self.account
        budget = account.budget if account is not None else None
        return p.ClientRow(
            pid=self.pid,
            uid=self.uid,
            name=self.name,
            priority=self.priority.value,
            buffers=len(buffers),
            bytes=sum(entry.size for entry in buffers),
            mappings=sum(entry.value.dsp_address is not None for entry in buffers),
            domain=self.domain_name,
            hung_calls=self.hung_calls,
            throttled=account.throttled if account else False,
            handles=sum(1 for _ in self.objects.entries(Kind.HANDLE)),
            calls_in_flight=self.calls_in_flight,
            calls_done=self.calls_done,
            dsp_us=_us(account.dsp_seconds) if account else 0,
            queued=account.queued if account else 0,
            running=account.running if account else 0,
            wait_p50_us=_us(account.wait_percentile(0.5)) if account else 0,
            wait_p99_us=_us(account.wait_percentile(0.99)) if account else 0,
            misses=account.misses if account else 0,
            late=account.late if account else 0,
            overruns=account.overruns if account else 0,
            budget_period_us=_us(budget.period) if budget else 0,
            budget_us=_us(budget.budget) if budget else 0,
            models=tuple(models[:64]),
            held=_held_rows(account) if account else (),
        )


def _held_rows(account: Account) -> tuple[p.HoldRow, ...]:
    return tuple(
        p.HoldRow(reason=hold.value, batches=batches, held_us=_us(seconds))
        for hold, (batches, seconds) in account.batch_holds.items()
    )


def _us(seconds: float) -> int:
    return max(0, round(seconds * 1_000_000))


class Clients:
    """Every connected client, admission and the quotas that span clients.

    The trio thread admits and removes clients while worker threads run the quota
    checks of arriving requests: the set is only touched under ``_lock``, and every
    reader works on a snapshot (a tuple made under the lock), never on the set itself.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._all: set[Client] = set()
        self._loading: collections.Counter[int] = collections.Counter()
        """Model loads in flight (arrived, not ended), by uid."""
        self._departed_calls = 0
        """DSP calls answered for clients that have left: with the connected ones', the
        daemon's total since start, which never goes back when a client leaves."""
        self.reserving = threading.Lock()
        """Held from a quota's check to the reservation of what it admitted (a creating
        request's arrival): requests of a user's connections arrive on different
        threads, and two checks before either reservation would both pass, one over the
        quota per thread. Taken before the table's and an object table's locks."""

    def begin_load(self, client: Client) -> None:
        """One more model load of ``client``'s user in flight; QUOTA_EXCEEDED past
        ``[uid_limits] max_loads_in_flight`` (the loader takes users in turns, and this
        bounds how many turns one user queues). Pair with :meth:`end_load`."""
        limit = self.config.uid_limits.max_loads_in_flight
        with self._lock:
            if self._loading[client.uid] >= limit:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED,
                    resource="model loads in flight of this user",
                    limit=limit,
                )
            self._loading[client.uid] += 1

    def end_load(self, client: Client) -> None:
        with self._lock:
            self._loading[client.uid] -= 1
            if self._loading[client.uid] <= 0:
                del self._loading[client.uid]

    def snapshot(self) -> tuple[Client, ...]:
        """The clients now (any thread)."""
        with self._lock:
            return tuple(self._all)

    def __iter__(self) -> Iterator[Client]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._all)

    def admit(self, client: Client) -> None:
        with self._lock:
            limit = self.config.limits.max_clients
            if len(self._all) >= limit:
                raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="clients", limit=limit)
            mine = self.config.uid_limits.max_clients
            if sum(c.uid == client.uid for c in self._all) >= mine:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource="clients of this user", limit=mine
                )
            self._all.add(client)
            client.quotas = self

    def census(self) -> tuple[tuple[Client, ...], int]:
        """The clients now and the DSP calls answered for those that have left, taken
        together (any thread): their sum is the daemon's total since start."""
        with self._lock:
            return tuple(self._all), self._departed_calls

    def remove(self, client: Client) -> None:
        """``client`` has left (its requests have all ended): its answered calls stay in
        the daemon's total. Removing one that is not here changes nothing."""
        with self._lock:
            if client in self._all:
                self._all.remove(client)
                self._departed_calls += client.calls_done

    def check_buffer(self, client: Client, size: int) -> None:
        """Room for one more buffer of ``size`` bytes: for this client, for its user and
        for the daemon. A user's and the daemon's bytes include their models' (file and
        arena): both are memory a client made npud hold."""
        counts = [(c, _held(c)) for c in {*self.snapshot(), client}]
        scopes = (
            ("buffers", "buffer bytes", self.config.client_limits, (client,)),
            (
                "buffers of this user",
                "buffer bytes of this user",
                self.config.uid_limits,
                tuple(c for c, _ in counts if c.uid == client.uid),
            ),
            (
                "daemon buffers",
                "daemon buffer bytes",
                self.config.limits,
                tuple(c for c, _ in counts),
            ),
        )
        pending = dict(counts)
        for buffers_name, bytes_name, limits, members in scopes:
            buffers = sum(pending[c][0] for c in members)
            taken = sum(pending[c][1] for c in members)
            if buffers >= limits.max_buffers:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource=buffers_name, limit=limits.max_buffers
                )
            if taken + size > limits.max_buffer_bytes:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource=bytes_name, limit=limits.max_buffer_bytes
                )

    def check_handle(self, client: Client) -> None:
        limit = self.config.client_limits.max_handles
        if client.objects.pending(Kind.HANDLE)[0] >= limit:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="handles", limit=limit)
        mine = self.config.uid_limits.max_handles
        used = sum(
            c.objects.pending(Kind.HANDLE)[0] for c in self.snapshot() if c.uid == client.uid
        )
        if used >= mine:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="handles of this user", limit=mine)

    def check_model(self, client: Client, size: int) -> None:
        """Room for one more model of ``size`` bytes (its file, then file plus arena): in
        the client's model limits, in its user's model slots, and in the bytes its user
        and the daemon may hold (buffers and models together)."""
        mine = self.config.client_limits
        count, used = client.objects.pending(Kind.MODEL)
        if count >= mine.max_models:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="models", limit=mine.max_models)
        if used + size > mine.max_model_bytes:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED, resource="model bytes", limit=mine.max_model_bytes
            )
        everyone = {*self.snapshot(), client}
        ours = [c for c in everyone if c.uid == client.uid]
        user = self.config.uid_limits
        models = sum(c.objects.pending(Kind.MODEL)[0] for c in ours)
        if models >= user.max_models:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED, resource="models of this user", limit=user.max_models
            )
        if sum(_held(c)[1] for c in ours) + size > user.max_buffer_bytes:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED,
                resource="buffer and model bytes of this user",
                limit=user.max_buffer_bytes,
            )
        daemon = self.config.limits
        if sum(_held(c)[1] for c in everyone) + size > daemon.max_buffer_bytes:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED,
                resource="daemon buffer and model bytes",
                limit=daemon.max_buffer_bytes,
            )

    def check_model_bytes(self, client: Client) -> None:
        """The client's models, as now sized (a load learns its arena's size), are within
        ``max_model_bytes``, and its user's and the daemon's bytes within theirs."""
        limit = self.config.client_limits.max_model_bytes
        if client.objects.pending(Kind.MODEL)[1] > limit:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="model bytes", limit=limit)
        everyone = {*self.snapshot(), client}
        user = self.config.uid_limits.max_buffer_bytes
        if sum(_held(c)[1] for c in everyone if c.uid == client.uid) > user:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED, resource="buffer and model bytes of this user", limit=user
            )
        daemon = self.config.limits.max_buffer_bytes
        if sum(_held(c)[1] for c in everyone) > daemon:
            raise CodedError(
                ErrorCode.QUOTA_EXCEEDED, resource="daemon buffer and model bytes", limit=daemon
            )


def _held(client: Client) -> tuple[int, int]:
    """What ``client`` holds for the user and daemon quotas: its buffers, and the bytes of
    its buffers and its models together."""
    buffers, buffer_bytes = client.objects.pending(Kind.BUFFER)
    return buffers, buffer_bytes + client.objects.pending(Kind.MODEL)[1]

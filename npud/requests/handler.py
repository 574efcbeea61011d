"""The base every request's handler is built on: where its work runs, its answer, its steps.

A handler does its work in steps, so that a connection's requests keep their
order (PROTOCOL.md section 6) while running concurrently:

* :meth:`Handler.start` runs when the request *arrives*, in arrival order, on
  the thread that read it: it checks what can be checked at once and resolves
  or reserves the ids the request names (:class:`ObjectTable`);
* :meth:`Handler.gates` names what must exist first (an object that an
  earlier request is still creating, a destroyed object's last user);
* :meth:`Handler.run` does the work, synchronously, on the thread its
  :class:`Route` names, and returns the answer;
* :meth:`Handler.end` runs after the answer went out, however it ended, and
  gives back what the arrival step held.

Every failure is a :class:`CodedError`; the data path turns it into the
request's ``error`` reply in one place.
"""

from __future__ import annotations

import abc
import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

import npu_protocol as p
from npu_client.transport import OwnedFd
from npu_protocol import CodedError, ErrorCode
from npud.domain.life import Domain
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.session import FastRpcSession
from npud.requests.clients import Client, Clients, Entry, Gate, Kind, unknown
from npud.requests.holdings import (
    HeldBuffer,
    OpenHandle,
)
from npud.runtime.scheduler import Account

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    from npud.requests.models import NpuModel


R = TypeVar("R", bound=p.Request)


class Route(enum.Enum):
    """Where a request's work runs."""

    DSP = "dsp"
    """Through the scheduler, on a data-path worker: the DSP-bound calls."""
    CONTROL = "control"
    """The domain's control lane: allocation and mapping, short calls that never wait
    behind an invoke."""
    LOADER = "loader"
    """The domain's loader lane: remotectl open and close, model load and unload (a skel
    or a model is read through the listener)."""
    HERE = "here"
    """On the thread that read it: cheap, and touches no DSP."""
    WAIT = "wait"
    """The domain's waits lane: a call that waits for the DSP (invoke with ``wait``) takes
    no scheduler slot and no worker, and the watchdog leaves it alone."""


@dataclass
class Answer:
    """A successful reply and the fd that travels with it (the link closes it once sent)."""

    reply: p.AnyReply
    fd: OwnedFd | None = None


class DaemonView(Protocol):
    """What a request may ask of the daemon as a whole, beyond its client and its domain
    (npud.daemon.broker provides it, given to every handler at its arrival): the status,
    and for root's debug faults another domain."""

    def status(self, viewer: Client) -> p.DaemonStatus: ...

    def domain_named(self, name: str) -> Domain | None: ...


class Handler(abc.ABC, Generic[R]):
    """One request, from its arrival to its answer. It is given its client and the
    domain the client's calls run in, and touches nothing else."""

    route: Route
    """Where its work runs (a class's own, or set per request)."""
    acquires: ClassVar[bool] = True
    """Takes DSP resources: refused with SHUTTING_DOWN once the daemon stops.
    Releases (free, unmap, close), status and ping are still served then."""
    since: ClassVar[p.Feature | None] = None
    """The protocol feature that brought this request (None: version 1): on a connection
    that does not speak it, it is answered UNSUPPORTED (PROTOCOL.md section 12)."""
    creates: ClassVar[bool] = False
    """Creates an object (alloc, open, model_load): takes the connection's next id at
    arrival whatever its answer, so a pipelining client can predict every id
    (PROTOCOL.md section 6). Its ``arrive`` reserves with :meth:`_reserve`."""
    _reserved = False

    timing: CallTiming | None = None
    """A DSP-bound call's timing (invoke, model run, chain), built at its arrival; the
    data path reads it."""
    dsp_seconds: float = 0.0
    reported_dsp_seconds: float | None = None
    """The DSP time the DSP reported with the call's answer (the emulator's dspqueue
    ``wait_signal``: the op batches it answers); None when it reported none, as a
    device's kernel never does (docs/scheduling.md, "The LLM's batches")."""
    session: FastRpcSession | None = None
    """The session its DSP work runs on, taken at arrival by the handlers that call the
    DSP: a watchdog that fires after the domain restarted must not end the new one."""

    @property
    def doorbell(self) -> bool:
        """Is it an op batch's doorbell (docs/scheduling.md, "The LLM's batches")? Only
        an invoke can be."""
        return False

    def __init__(self, client: Client, domain: Domain, request: R, daemon: DaemonView) -> None:
        self.client = client
        self.domain = domain
        self.request = request
        self.daemon = daemon
        """The daemon as a whole, as far as a request may see it."""
        self._held: list[Entry] = []
        self._waits: list[Gate] = []

    def start(self) -> None:
        """The arrival step; on a refusal, what it took is given back and it raises."""
        try:
            if self.since is not None and not p.speaks(self.client.protocol_version, self.since):
                # No version numbers in the text: an error names only the request's.
                raise CodedError(
                    ErrorCode.UNSUPPORTED,
                    what=f"{p.tag_of(self.request)} on this connection: it came with a later"
                    " protocol version than this connection speaks; offer that version in"
                    " the hello",
                )
            if self.acquires and self.client.watch_only:
                raise CodedError(
                    ErrorCode.NOT_PERMITTED,
                    detail=f"{p.tag_of(self.request)}: this connection's hello said it only "
                    "watches (hello.watch): it has no DSP process; connect without it",
                )
            if self.acquires and self.domain.device.stopping:
                raise CodedError(ErrorCode.SHUTTING_DOWN)
            self.arrive()
        except BaseException:
            if self.creates and not self._reserved:
                self.client.objects.skip_id()  # refused before its id was reserved
            self.end()
            raise

    def arrive(self) -> None:
        """Checks and id resolution at arrival; raise CodedError to refuse."""

    def _reserve(self, kind: Kind, size: int = 0) -> Entry:
        """The id of the object this request creates (the last step of its arrival)."""
        entry = self.client.objects.reserve(kind, size)
        self._reserved = True
        return entry

    def gates(self) -> list[Gate]:
        """What must be open before :meth:`run` may start."""
        return self._waits

    @abc.abstractmethod
    def run(self) -> Answer:
        """Do the work; raise CodedError for a refusal."""

    def end(self) -> None:
        """Give back what the arrival step held. Idempotent."""
        held, self._held = self._held, []
        for entry in held:
            self.client.objects.done_with(entry)

    @property
    def quotas(self) -> Clients:
        quotas = self.client.quotas
        assert quotas is not None, "a welcomed client was admitted"
        return quotas

    @property
    def limits(self) -> p.ClientLimits:
        limits = self.client.limits
        assert limits is not None, "a welcomed client was told its limits"
        return limits

    def _use(self, object_id: int, kind: Kind) -> Entry:
        entry = self.client.objects.use(object_id, kind)
        self._held.append(entry)
        self._waits.append(entry.created)
        return entry

    @staticmethod
    def _ready(entry: Entry) -> object:
        """The object behind ``entry`` (its creating request has ended)."""
        if entry.lost:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        if not entry.live:
            raise unknown(entry.kind, entry.id)
        return entry.value

    def _held_buffer(self, entry: Entry) -> HeldBuffer:
        held = self._ready(entry)
        assert isinstance(held, HeldBuffer)
        return held

    def _model(self, entry: Entry) -> NpuModel:
        from npud.requests.models import NpuModel  # noqa: PLC0415  (loaded: the entry holds one)

        model = self._ready(entry)
        assert isinstance(model, NpuModel)
        return model

    def _handle(self, entry: Entry) -> OpenHandle:
        handle = self._ready(entry)
        assert isinstance(handle, OpenHandle)
        return handle

    def _fallback(self, size: int) -> DmaBuffer:
        """A buffer from the FastRPC driver (no system heap on this machine)."""
        session = self.domain.current()
        return self.domain.run(session, lambda: session.alloc_unowned(size))


class CallTiming:
    """A DSP-bound call's timing, made at its arrival (invoke, model run, chain) and held
    by its handler (``handler.timing``): its timeout and deadline, its client's account,
    and its place in the client's count of calls in flight, taken by :meth:`begin` (the
    arrival's last step) and given back by :meth:`end`. A ``timeout_ms`` past the
    client's ``max_timeout_ms`` is refused (INVALID_ARGUMENT)."""

    __slots__ = (
        "_client",
        "_counted",
        "_max_in_flight",
        "account",
        "deadline",
        "deadline_ms",
        "timeout",
        "timeout_ms",
    )

    def __init__(
        self,
        client: Client,
        limits: p.ClientLimits,
        timeout_ms: int | None,
        deadline_ms: int | None,
    ) -> None:
        if timeout_ms is not None and timeout_ms > limits.max_timeout_ms:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"timeout_ms {timeout_ms} exceeds max_timeout_ms {limits.max_timeout_ms}",
            )
        self.timeout_ms = timeout_ms if timeout_ms is not None else limits.default_timeout_ms
        """As asked, else the client's default; None: no timeout."""
        self.timeout = None if self.timeout_ms is None else self.timeout_ms / 1000
        self.deadline_ms = deadline_ms
        self.deadline = None if deadline_ms is None else time.monotonic() + deadline_ms / 1000
        """Absolute, on time.monotonic(); None: no deadline."""
        self.account: Account | None = client.account
        self._client = client
        self._max_in_flight = limits.max_in_flight
        self._counted = False

    def begin(self) -> None:
        """Count the call in flight (the last arrival step: :meth:`end` gives it back)."""
        self._client.begin_call(self._max_in_flight)
        self._counted = True

    def end(self) -> None:
        """Give the count back (once; nothing if :meth:`begin` did not take it)."""
        if self._counted:
            self._counted = False
            self._client.end_call()


# --- buffers ----------------------------------------------------------------------


def destroyable(entry: Entry) -> list[Gate]:
    """What a destroying request waits for: the object exists, and every earlier
    request that named it has ended."""
    return [entry.created] + ([entry.idle] if entry.idle is not None else [])

"""The data path's half of one client connection: read frames, write replies, never block.

After the Welcome, a connection's socket belongs to the data path (the trio
side keeps the socket object and closes it at the very end). A :class:`Link`
holds the sans-IO protocol object and everything the worker threads share
about the connection, under one lock:

* **Reading** happens on one worker at a time: the socket's read registration
  in the data path's epoll is one-shot and re-armed after each read, so
  frames are taken, and requests arrive, in order.
* **Writing** never blocks a thread: a reply is sent with ``MSG_DONTWAIT``;
  what the socket cannot take now waits in the link's outbox, flushed by a
  worker when the socket is writable (a second fd, a dup of the socket, is
  registered for that). A client that takes nothing for ``send_timeout``
  seconds is dropped.
* **Ending**: the link is *finished* once no more requests can arrive (the
  peer closed, broke the protocol or was dropped), every request that
  arrived has ended and the outbox is flushed (or the link was dropped). Its
  owner then releases the client's resources. A client that half-closes its
  socket after sending requests still gets every answer.

The link's life is a :class:`~npud.datapath.link_states.LinkState`, changed only
through the table of :mod:`npud.datapath.link_states`; what the link tells
(arrivals, the write registration, hang-up, violation, finish) goes to the one
:class:`LinkOwner` it is given at construction.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

import npu_protocol as p
from npu_client.transport import (
    OwnedFd,
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npud.datapath.drain import Ending, drain
from npud.datapath.link_states import (
    ANSWERING,
    DROPPED,
    FINISHED,
    HUNG_UP,
    READING,
    RELEASED,
    Change,
    LinkState,
    LinkStateError,
    move,
)
from npud.ops.loglimit import LogBudget
from npud.runtime.closer import MAX_PENDING_PER_UID

if TYPE_CHECKING:
    from npud.requests import Handler

log = structlog.get_logger("npud.datapath.link")

SEND_FLAGS: Final = int(socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
RECEIVE_FLAGS: Final = int(socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
# Plain ints: an IntFlag's ``|`` and ``&`` run the enum's Python code at every call.
_CTRUNC: Final = int(socket.MSG_CTRUNC)
MIN_OUTBOX_BYTES: Final = 8 * 1024 * 1024
"""What may wait to be sent to one client, at least: its replies beyond what its socket
buffer holds. The bound is the larger of this and four of its largest frames; a client
that reads nothing while it asks for more is dropped past it."""
FRAME_ANCILLARY_SPACE: Final = socket.CMSG_SPACE(p.MAX_FDS_PER_FRAME * array.array("i").itemsize)
"""Room for the fds of one frame and no more (PROTOCOL.md section 3): a sendmsg with more
is cut short by the kernel, which closes the surplus and says MSG_CTRUNC (FDS_TRUNCATED)."""
RECV_CHUNK: Final = 256 * 1024
"""Bytes taken from one socket in one read; more waits for the next turn."""


class LinkOwner(Protocol):
    """What a link tells, and asks of, the connection it serves: given at construction.

    ``arrive`` and ``close_later`` are called with the link's lock held or from its
    reader; ``arm_write`` and ``violated`` with the lock held (they must not call
    back into the link); ``hung_up`` and ``finished`` once each, without the lock."""

    def arrive(self, request: p.AnyRequest) -> Handler[Any]:
        """A request's arrival step: its handler, started (raises CodedError to refuse)."""
        ...

    def close_later(self, fds: Sequence[int]) -> bool:
        """Close fds the client sent (owned from then on) off this thread; False when its
        user has too many waiting to be closed (npud/runtime/closer.py): the link is
        dropped."""
        ...

    def arm_write(self, link: Link) -> None:
        """The outbox holds what the socket did not take: watch for writability."""
        ...

    def violated(self, link: Link, reason: str) -> None:
        """The link is dropped for breaking the protocol (a fatal frame, too many stray
        fds, too many requests refused NOT_PERMITTED): called before the client is told,
        so that its next connection is judged with this drop counted."""
        ...

    def hung_up(self, link: Link) -> None:
        """Requests of the client are still pending but nobody can read their answers
        (it closed its socket, or was dropped)."""
        ...

    def finished(self, link: Link) -> None:
        """The link is over (LinkState.FINISHED): the client's resources may go."""
        ...


@dataclass(frozen=True)
class LinkStatistics:
    """A link at one moment, for an operator or a test (trio's ``statistics()``)."""

    state: LinkState
    pending: int
    """Requests that arrived and have not ended."""
    outbox_frames: int
    """Frames waiting for the socket to take them."""
    outbox_bytes: int
    partial_frame_seconds: float | None
    """How long the client has left a frame half sent (None: it has not)."""
    backlog_seconds: float | None
    """How long the outbox has waited for the socket (None: it has not)."""
    not_permitted: int
    """Requests of the client refused NOT_PERMITTED."""
    reason: str
    """Why requests ended (empty while reading)."""


class Link:
    """See the module docstring. Every method may be called from any thread."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: p.ServerConnection,
        owner: LinkOwner,
        *,
        log_context: structlog.typing.FilteringBoundLogger,
        fds_waiting_cap: int = MAX_PENDING_PER_UID,
        log_budget: LogBudget | None = None,
        refusals_cap: int = 0,
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.write_fd = OwnedFd(os.dup(self.fd))
        """A second fd of the socket, so writability has its own epoll registration."""
        self.protocol = protocol
        self.owner: Final = owner
        self.log = log_context
        self.log_budget = log_budget or LogBudget(20, 10.0)
        """The lines this client may cause (refusals, stray fds): see npud/ops/loglimit.py."""
        self.partial_since: float | None = None
        """When the client began the frame it has not finished sending, if any."""
        self.partial_timer: float | None = None
        """The ``partial_since`` whose timer is set (the data path's)."""
        self.lock = threading.Lock()
        self.read_lock = threading.Lock()
        """Held by the one worker that reads the socket (:meth:`take_read_turn`)."""
        self._reader: int | None = None
        """The thread whose read turn it is."""
        self._state = READING
        self.reason = ""
        self.not_permitted = 0
        """Requests of the client refused NOT_PERMITTED."""
        self._refusals_cap = refusals_cap
        """Past this many of them (0: never) the link is dropped as a violation."""
        self.pending: set[object] = set()
        """Requests that arrived and have not ended (their handlers)."""
        self._outbox: deque[tuple[memoryview, list[OwnedFd]]] = deque()
        self._outbox_bytes = 0
        self.backlog_since: float | None = None
        self._fds_waiting_cap = fds_waiting_cap

    # --- state ----------------------------------------------------------------------
    @property
    def state(self) -> LinkState:
        return self._state

    def _change_locked(self, change: Change) -> None:
        """Move along the table (npud/datapath/link_states.py), checking what the state
        stands for; raises LinkStateError for a move it refuses."""
        new = move(self._state, change)
        if new is HUNG_UP and not self.pending:
            raise LinkStateError("a link hangs up only with requests pending")
        if new is FINISHED and (self.pending or self._outbox or self.read_lock.locked()):
            raise LinkStateError(
                "a link finishes only with nothing pending, nothing to send and no reader"
            )
        self._state = new

    @property
    def hung_up(self) -> bool:
        """Nobody can read the answers of requests still pending: the hang-up was told, or
        the owner released the link."""
        state = self._state
        return state is HUNG_UP or state is RELEASED

    def statistics(self) -> LinkStatistics:
        now = time.monotonic()
        with self.lock:
            partial, backlog = self.partial_since, self.backlog_since
            return LinkStatistics(
                state=self._state,
                pending=len(self.pending),
                outbox_frames=len(self._outbox),
                outbox_bytes=self._outbox_bytes,
                partial_frame_seconds=None if partial is None else now - partial,
                backlog_seconds=None if backlog is None else now - backlog,
                not_permitted=self.not_permitted,
                reason=self.reason,
            )

    # --- reading ----------------------------------------------------------------
    def take_read_turn(self) -> bool:
        """Become the link's one reader; False when another worker is (it re-arms the
        read registration after it lets go, so nothing is missed). The reader calls
        :meth:`read`, lets the requests arrive, then :meth:`end_read_turn`."""
        if not self.read_lock.acquire(blocking=False):
            return False
        self._reader = threading.get_ident()
        return True

    def end_read_turn(self) -> None:
        self._reader = None
        self.read_lock.release()

    def arrive(self, request: p.AnyRequest) -> Handler[Any]:
        """The owner's arrival step for ``request`` (the reader's, in order)."""
        return self.owner.arrive(request)

    def read(self, buffer: bytearray) -> list[p.ClientMessage | p.ConnectionClosed]:
        """One non-blocking read into ``buffer``; the messages it completed, in order.

        Protocol violations answer with one error and drop the link; stray fds
        are closed; end of stream ends reading. Call in the read turn
        (:meth:`take_read_turn`; the one-shot read registration brings one worker).
        """
        if self._reader != threading.get_ident():
            raise LinkStateError("a link is read only in its reader's turn (take_read_turn)")
        if self._state is not READING:
            return []
        try:
            data, fds, truncated = self._receive(buffer)
        except OSError as exc:
            self.end_reading(f"receive failed: {errno.errorcode.get(exc.errno or 0, exc)}")
            return [p.ConnectionClosed()]
        with self.lock:
            if self._state is not READING:
                # Dropped (or released) while this read was on its way: nothing it
                # brings may become a request; its fds are closed.
                self.owner.close_later([fd.detach() for fd in fds])
                return []
            if data is not None:
                with data:  # copied by the protocol; the view ends here
                    self.protocol.receive_data(
                        data, [fd.detach() for fd in fds], fds_truncated=truncated
                    )
            found, ending = drain(
                self.protocol,
                close_later=self.owner.close_later,
                log=self.log,
                log_budget=self.log_budget,
                fds_waiting_cap=self._fds_waiting_cap,
            )
            messages: list[p.ClientMessage | p.ConnectionClosed] = list(found)
            if ending is None:
                self._note_partial_frame()
                return messages
            if ending.violation:
                self._refuse_locked(ending)
            else:
                self._change_locked(Change.REQUESTS_END)
                self.reason = self.reason or ending.reason
            messages.append(p.ConnectionClosed())
            return messages

    def _receive(self, buffer: bytearray) -> tuple[memoryview | None, list[OwnedFd], bool]:
        """One recvmsg: its bytes (None when nothing is new), its fds, and whether the
        kernel cut the fds short (MSG_CTRUNC, fatal).

        The bytes are a view of ``buffer``, not a copy: the protocol copies them once,
        into its frame reader (a frame may span reads, and ``buffer`` is the worker's,
        read into again at its next turn), before :meth:`read` lets go of the lock."""
        try:
            size, ancdata, flags, _ = self.sock.recvmsg_into(
                [buffer], FRAME_ANCILLARY_SPACE, RECEIVE_FLAGS
            )
        except BlockingIOError:
            return None, [], False  # what the protocol already holds is still processed
        data = memoryview(buffer)[:size]
        if not ancdata and not flags & _CTRUNC:
            return data, [], False  # most reads: no fds
        try:
            return data, parse_ancillary(ancdata, flags), False
        except TransportError:
            return data, [], True

    def _note_partial_frame(self) -> None:
        if self.protocol.bytes_buffered:
            if self.partial_since is None:
                self.partial_since = time.monotonic()
        else:
            self.partial_since = None

    def end_reading(self, reason: str) -> None:
        """No more requests can arrive (the receive failed)."""
        with self.lock:
            if self._state is READING:
                self._change_locked(Change.REQUESTS_END)
                self.reason = self.reason or reason
        self.tell_hangup()

    def tell_hangup(self) -> None:
        """Tell the owner ``hung_up`` once, if reading is over with requests still pending
        and nobody can read their answers: the link was dropped, or the peer closed its
        socket. A half-close (``shutdown(SHUT_WR)``) is not a hang-up: that client still
        reads every answer (PROTOCOL.md section 5)."""
        state = self._state
        if state is not ANSWERING and state is not DROPPED:
            # Read without the lock (it is called after every read): whatever ends
            # reading calls this again once it has.
            return
        with self.lock:
            state = self._state
            if not self.pending or (state is not ANSWERING and state is not DROPPED):
                return
            if state is ANSWERING and not self._peer_closed():
                return
            if state is ANSWERING:
                self._stop_sending_locked()  # nobody reads: what waits is let go
            self._change_locked(Change.HANG_UP)
        self.owner.hung_up(self)

    def _peer_closed(self) -> bool:
        """The peer closed its socket (both directions shut: POLLHUP), not just its
        sending side."""
        poller = select.poll()
        poller.register(self.fd, 0)  # POLLHUP and POLLERR are always reported
        try:
            return any(mask & (select.POLLHUP | select.POLLERR) for _, mask in poller.poll(0))
        except OSError:
            return True

    # --- requests ------------------------------------------------------------------
    def arrived(self, handler: object) -> None:
        with self.lock:
            if self._state is FINISHED:
                raise LinkStateError("a request arrived at a finished link")
            self.pending.add(handler)

    def ended(self, handler: object) -> None:
        with self.lock:
            self.pending.discard(handler)
            finished = self._finish_locked()
        if finished:
            self.owner.finished(self)

    # --- writing --------------------------------------------------------------------
    def send(self, message: p.ServerMessage, fds: Sequence[OwnedFd] = ()) -> bool:
        """Queue ``message`` for the client and send what the socket takes now.

        ``fds`` become the link's (closed once sent, or when the link is
        dropped). False when the message was not sendable (the link no longer
        talks, or the protocol refused it).
        """
        with self.lock:
            return self._send_locked(message, list(fds))

    def _send_locked(self, message: p.ServerMessage, fds: list[OwnedFd]) -> bool:
        state = self._state
        if state is not READING and state is not ANSWERING:
            _close_all(fds)
            return False
        try:
            data, numbers = self.protocol.send(message)
        except p.LocalProtocolError as exc:
            _close_all(fds)
            request_id = getattr(message, "id", None)
            if exc.code is p.ErrorCode.CONNECTION_CLOSED:
                return False  # the client is gone or finished; nothing to tell it
            if request_id is None or isinstance(message, p.ErrorMessage):
                self.log.info("message not sent", error=str(exc), message=p.tag_of(message))
                return False
            # Our own bug, or a reply too large for the frame limit: the request
            # still gets its one answer.
            self.log.error("reply not sendable", error=str(exc), message=p.tag_of(message))
            fallback = p.ErrorMessage.for_code(
                p.ErrorCode.INTERNAL_ERROR, id=request_id, detail=f"reply not sendable: {exc}"
            )
            return self._send_locked(fallback, [])
        assert [fd.fileno() for fd in fds] == numbers, "the message's fds are the ones given"
        self._outbox.append((memoryview(data), fds))
        self._outbox_bytes += len(data)
        if len(self._outbox) == 1:
            self._flush_locked()
        bound = self.outbox_bound
        if self._outbox_bytes > bound:
            self.log.warning(
                "dropped: it reads none of its replies", waiting=self._outbox_bytes, bound=bound
            )
            self._drop_locked(f"it left more than {bound} bytes of replies unread")
        return True

    @property
    def outbox_bound(self) -> int:
        """Bytes that may wait to be sent to the client (MIN_OUTBOX_BYTES)."""
        limits = self.protocol.limits
        frame = limits.max_frame_size if limits is not None else p.DEFAULT_MAX_FRAME_SIZE
        return max(MIN_OUTBOX_BYTES, 4 * frame)

    @property
    def outbox_bytes(self) -> int:
        with self.lock:
            return self._outbox_bytes

    def flush(self) -> None:
        """Send what waits in the outbox (the socket became writable)."""
        with self.lock:
            self._flush_locked()
        self.check_finished()

    def _flush_locked(self) -> None:
        while self._outbox:
            data, fds = self._outbox[0]
            try:
                sent = self.sock.sendmsg(
                    [data], fds_ancillary([fd.fileno() for fd in fds]), SEND_FLAGS
                )
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._drop_locked(f"send failed: {errno.errorcode.get(exc.errno or 0, exc)}")
                return
            if sent:
                _close_all(fds)  # they went with the frame's first byte
                fds.clear()
                self._outbox_bytes -= sent
            if sent == len(data):
                self._outbox.popleft()
                continue
            self._outbox[0] = (data[sent:], fds)
            if self.backlog_since is None:
                self.backlog_since = time.monotonic()
            self.owner.arm_write(self)
            return
        self.backlog_since = None

    # --- ending ----------------------------------------------------------------------
    def drop(self, reason: str) -> None:
        """Stop talking to the client now (it misbehaved, or the daemon stops)."""
        with self.lock:
            self._drop_locked(reason)
        self.tell_hangup()
        self.check_finished()

    def _drop_locked(self, reason: str) -> None:
        state = self._state
        if state is not READING and state is not ANSWERING:
            return  # it talks no more already
        self._change_locked(Change.DROP)
        self.reason = self.reason or reason
        self._stop_sending_locked()

    def _stop_sending_locked(self) -> None:
        """What waits to be sent is let go, and the socket shut."""
        for _, fds in self._outbox:
            _close_all(fds)
        self._outbox.clear()
        self._outbox_bytes = 0
        self.backlog_since = None
        # Wakes any poll on the socket; the peer sees the end at once.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _refuse_locked(self, ending: Ending) -> None:
        """Drop the link for breaking the protocol: its owner is told first (its user is
        charged before the client hears), then the client gets the one answer."""
        state = self._state
        if state is not READING and state is not ANSWERING:
            return
        assert ending.farewell is not None
        self.owner.violated(self, ending.reason)
        self._send_locked(ending.farewell, [])
        self._drop_locked(ending.reason)

    def check_finished(self) -> None:
        with self.lock:
            finished = self._finish_locked()
        if finished:
            self.owner.finished(self)

    def _finish_locked(self) -> bool:
        """True once, when the link has just finished: ``owner.finished`` is then due."""
        state = self._state
        if state is READING or state is FINISHED or state is RELEASED:
            return False
        if self.pending or self._outbox:
            return False
        # A worker inside read() holds read_lock: the link is not over until it
        # lets go (its _serve_read calls this again then), or a request it parses
        # could arrive for a client being released.
        if self.read_lock.locked():
            return False
        self._change_locked(Change.FINISH)
        return True

    def note_not_permitted(self) -> None:
        """A request of the client was refused NOT_PERMITTED (its answer sent): past
        ``refusals_cap`` of them the client keeps asking for what it may not have, and
        is dropped as a violation (its user pays: npud.daemon.penalties)."""
        with self.lock:
            self.not_permitted += 1
            if not self._refusals_cap or self.not_permitted < self._refusals_cap:
                return
            state = self._state
            if state is not READING and state is not ANSWERING:
                return
            self.log.warning(
                "dropped: too many requests refused NOT_PERMITTED", refused=self.not_permitted
            )
            self._refuse_locked(
                Ending(
                    "too many requests refused NOT_PERMITTED",
                    p.ErrorMessage.for_code(
                        p.ErrorCode.NOT_PERMITTED,
                        detail=f"{self.not_permitted} requests of this connection were "
                        "refused NOT_PERMITTED ([daemon] refused_requests_before_drop); closing",
                    ),
                )
            )
        self.tell_hangup()
        self.check_finished()

    def release_pending_fds(self) -> None:
        """Close the fds of frames the peer began and never finished, once the link is
        removed; a read still on its way (past its check, not yet holding the lock)
        closes what it brings instead of handing it to the protocol. What still waits to
        be sent (npud stops) is let go with its fds."""
        with self.lock:
            self._change_locked(Change.RELEASE)
            self._stop_sending_locked()
            self.owner.close_later(self.protocol.take_pending_fds())

    def close(self) -> None:
        """Release the link's own fd (the socket itself is its owner's)."""
        self.write_fd.close()


def _close_all(fds: list[OwnedFd]) -> None:
    for fd in fds:
        fd.close()

"""The hot path: worker threads over one epoll read requests, run DSP calls and reply.

Every welcomed connection's socket is registered in one epoll, one-shot. A
worker thread that wakes for a socket reads what is there, runs each request's
arrival step in order (``npud.requests``), re-arms the socket (so another
worker reads the connection's next requests), and then carries the requests:

* a DSP-bound call (``Route.DSP``) goes to the :class:`Scheduler`; when it may
  start at once, **this worker runs it and writes the reply itself**: the
  client's write wakes one thread, which answers, so a call costs one wake-up
  on each side, as a bare server's would;
* a call that must wait is run later by the worker whose call ends and frees
  its slot (or by an idle worker, woken for it);
* a dspqueue doorbell (``signal``, an op batch of llama.cpp) is such a call, but
  with ``batches = "gated"`` the batch it starts keeps its slot until the
  client's ``wait`` call brings the answer (or ``batch_answer_max`` passes), and
  doorbell-to-answer less the path's round trip is charged as the batch's DSP
  time; with ``"counted"`` the doorbell ends as a call and the batch's time is
  only charged (:mod:`npud.datapath.batches`). A doorbell held
  for realtime work goes at its bound, or when the realtime client it was held
  for turns quiet (a timer runs the scheduler's ``tick`` at ``next_recheck``);
* control requests (allocation, mapping, remotectl) go to the control and
  loader lanes, which run them and write the reply themselves; status and
  ping are answered on the spot.

Nothing on this path ever blocks on a client: replies that a socket cannot
take wait in the connection's outbox (:class:`Link`). Timeouts, deadlines of
queued calls and slow readers are handled by one timer thread
(:class:`Timers`), which also runs the watchdog of DSP calls that never return
(:mod:`npud.datapath.watchdog`). The trio thread keeps accept, the handshake, events,
recovery, signals and systemd; it never touches a request.

Guarantees kept: ids resolve in arrival order; a request's objects are held
until its answer is out; a call that is on the DSP is never abandoned (its
memory stays pinned until it returns, even when its timeout answered the
client or the client left); a connection's resources are released only
after every request of it has ended.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.datapath.batches import OpBatches
from npud.datapath.link import RECV_CHUNK, Link
from npud.datapath.link_states import LinkState
from npud.datapath.watchdog import CallWatchdog
from npud.ops.loglimit import fields as log_fields
from npud.requests import Answer, Handler, Route
from npud.requests.clients import Gate
from npud.runtime.scheduler import Job, Outcome, Scheduler
from npud.runtime.timers import Timer, Timers

if TYPE_CHECKING:
    pass

log = structlog.get_logger("npud.datapath.workers")

SEND_TIMEOUT: Final = 30.0
"""A client that takes no reply bytes for this long is dropped."""

_READ: Final = select.EPOLLIN | select.EPOLLONESHOT
_WRITE: Final = select.EPOLLOUT | select.EPOLLONESHOT
_STOP: Final = object()


class Call:
    """A request on its way: its handler, its link, and whether it was answered."""

    __slots__ = ("_answer", "handler", "job", "link", "timer")

    def __init__(self, handler: Handler[Any], link: Link) -> None:
        self.handler = handler
        self.link = link
        self._answer = [True]
        """The one answer, taken by the first :meth:`claim` (``list.pop`` is atomic:
        no lock for each call)."""
        self.job: Job | None = None
        self.timer: Timer | None = None

    def claim(self) -> bool:
        """True once: the caller gives the request its one answer."""
        try:
            self._answer.pop()
        except IndexError:
            return False
        return True


@dataclass(frozen=True)
class DataPathStatistics:
    """The data path at one moment, for an operator or a test (trio's ``statistics()``)."""

    links: int
    """Connections served (welcomed, not yet removed)."""
    workers: int
    busy_workers: int
    """Workers not waiting in the epoll: reading, answering, or in a DSP call."""
    tasks_waiting: int
    """Tasks posted for an idle worker, not yet taken."""


class DataPath:
    """See the module docstring."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        workers: int,
        frame_timeout: float = 10.0,
        call_watchdog: float = 0.0,
        on_hung: Callable[[Handler[Any], str], None] = lambda handler, reason: None,
        batches: Literal["gated", "counted"] = "gated",
        batch_answer_max: float = 2.0,
    ) -> None:
        self.scheduler = scheduler
        self.batches = batches
        self.batch_answer_max = batch_answer_max
        self._epoll = select.epoll()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_read, select.EPOLLIN | select.EPOLLONESHOT)
        self._ready: deque[Callable[[], None] | object] = deque()
        self._ready_lock = threading.Lock()
        self._links: dict[int, Link] = {}
        self._links_lock = threading.Lock()
        self.timers = Timers("npud-timers")
        self._batches = OpBatches(
            scheduler, self.timers, answer_max=batch_answer_max, on_finish=self._start_all
        )
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"npud-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._busy = [False] * workers
        """Each worker's own flag (written by it alone): it is not waiting in the epoll."""
        self._started = False
        self.frame_timeout = frame_timeout
        self.call_watchdog = call_watchdog
        self._on_hung = on_hung
        self._watchdog = CallWatchdog[Call](self.timers, call_watchdog, self._report_hung)

    # --- life ----------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        self.timers.start()
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float) -> bool:
        """End the workers (those inside a DSP call finish it first); True if all ended."""
        if not self._started:
            self._close_fds()
            return True
        deadline = time.monotonic() + timeout
        for _ in self._threads:
            self._post(_STOP)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.timers.stop(max(0.0, deadline - time.monotonic()))
        alive = any(thread.is_alive() for thread in self._threads)
        if not alive:
            self._close_fds()
        return not alive

    def _close_fds(self) -> None:
        self._epoll.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def statistics(self) -> DataPathStatistics:
        with self._ready_lock:
            waiting = sum(1 for task in self._ready if task is not _STOP)
        return DataPathStatistics(
            links=len(self.links()),
            workers=len(self._threads),
            busy_workers=sum(self._busy),
            tasks_waiting=waiting,
        )

    @property
    def calls_done(self) -> int:
        """DSP calls run and answered since start (counted by the scheduler, under the
        lock it takes for each call anyway)."""
        return self.scheduler.calls_done

    # --- connections ------------------------------------------------------------------
    def add(self, link: Link) -> None:
        """Start serving ``link`` (its protocol may already hold bytes to process). Its
        owner (:class:`~npud.datapath.link.LinkOwner`) passes the data path's part on:
        :meth:`arm_write`, and :meth:`release_queued` when the link hangs up."""
        with self._links_lock:
            self._links[link.fd] = link
            self._links[link.write_fd.fileno()] = link
        # Both registrations start disarmed (one-shot with no events: a hang-up
        # is reported once, not in a loop). The first read below arms reading.
        self._epoll.register(link.write_fd.fileno(), select.EPOLLONESHOT)
        self._epoll.register(link.fd, select.EPOLLONESHOT)
        self._post(lambda: self._serve_read(link))

    def remove(self, link: Link) -> None:
        """Forget a finished link (before its owner closes the socket)."""
        with self._links_lock:
            self._links.pop(link.fd, None)
            self._links.pop(link.write_fd.fileno(), None)
        for fd in (link.fd, link.write_fd.fileno()):
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        link.close()

    def links(self) -> list[Link]:
        with self._links_lock:
            return list({id(link): link for link in self._links.values()}.values())

    # --- the workers ---------------------------------------------------------------------
    def _work(self, index: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        buffer = bytearray(RECV_CHUNK)
        self._buffer.value = buffer
        busy = self._busy
        while True:
            busy[index] = False
            try:
                events = self._epoll.poll(-1, 1)
            except InterruptedError:
                continue
            except (OSError, ValueError):  # the epoll was closed: stopping
                return
            busy[index] = True
            for fd, mask in events:
                if fd == self._wake_read:
                    task = self._take_ready()
                    if task is _STOP:
                        busy[index] = False
                        return
                    if task is not None:
                        self._run_task(task)  # type: ignore[arg-type]
                    continue
                with self._links_lock:
                    link = self._links.get(fd)
                if link is None:
                    continue
                try:
                    if fd == link.fd:
                        self._serve_read(link)
                    elif mask & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                        link.flush()
                except Exception:
                    # A bug of ours: one connection's trouble, never a dead worker.
                    link.log.exception("serving a connection failed; dropping it")
                    link.drop("internal error")

    _buffer = threading.local()

    def _run_task(self, task: Callable[[], None]) -> None:
        try:
            task()
        except Exception:
            log.exception("data path task failed")

    def _post(self, task: Callable[[], None] | object) -> None:
        """Have an idle worker run ``task``.

        The wake pipe holds a byte whenever tasks wait; its one-shot
        registration wakes one worker, which re-arms it for the next.
        """
        with self._ready_lock:
            self._ready.append(task)
            if len(self._ready) == 1:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.write(self._wake_write, b"\0")
        self._rearm_wake()

    def _take_ready(self) -> Callable[[], None] | object | None:
        with self._ready_lock:
            task = self._ready.popleft() if self._ready else None
            if not self._ready:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_read, 4096)
        self._rearm_wake()  # another worker takes the next one, if any
        return task

    def _rearm_wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.modify(self._wake_read, select.EPOLLIN | select.EPOLLONESHOT)

    def arm_write(self, link: Link) -> None:
        """``link``'s outbox holds what its socket did not take: a worker flushes it when
        the socket is writable; past ``SEND_TIMEOUT`` without progress it is dropped."""
        with contextlib.suppress(OSError, ValueError):
            self._epoll.modify(link.write_fd.fileno(), _WRITE)
        self.timers.call_later(SEND_TIMEOUT, lambda: self._check_backlog(link))

    def _check_partial(self, link: Link, started: float) -> None:
        """A frame begun at ``started`` is still not whole: the client stalls; drop it."""
        if link.partial_since == started and link.state is LinkState.READING:
            link.log.warning(
                "client left a frame half sent; dropping it", seconds=self.frame_timeout
            )
            link.drop("left a frame half sent")

    def _check_backlog(self, link: Link) -> None:
        since = link.backlog_since
        if since is not None and time.monotonic() - since >= SEND_TIMEOUT:
            link.log.warning("client stopped reading; dropping it", timeout=SEND_TIMEOUT)
            link.drop("stopped reading its replies")

    # --- reading and arrival ------------------------------------------------------------
    def _serve_read(self, link: Link) -> None:
        """Read what the link has, let its requests arrive in order, re-arm, carry them."""
        # One reader at a time: a hang-up can be reported while the read posted
        # when the link was added runs. The loser leaves: the winner re-arms
        # after it lets go, so nothing is missed.
        if not link.take_read_turn():
            return
        try:
            buffer = getattr(self._buffer, "value", None) or bytearray(RECV_CHUNK)
            calls: list[Call] = []
            for message in link.read(buffer):
                if isinstance(message, p.ConnectionClosed):
                    break
                if isinstance(message, p.Hello):  # the protocol refuses a second one
                    continue
                call = self._arrive(link, message)
                if call is not None:
                    calls.append(call)
        finally:
            link.end_read_turn()
        link.tell_hangup()
        started = link.partial_since
        if started is not None and self.frame_timeout and link.partial_timer != started:
            link.partial_timer = started  # one timer per frame begun
            self.timers.call_at(
                started + self.frame_timeout, lambda: self._check_partial(link, started)
            )
        if link.state is LinkState.READING:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.modify(link.fd, _READ)
        else:
            if link.pending and not link.hung_up:
                # Half-closed with calls pending: wake on the peer's full close (POLLHUP
                # is reported with no event asked for), which releases its queued calls.
                # Nothing pending (or its hang-up told), nothing is left to wake for: the
                # registration stays disarmed, or the peer's POLLHUP would wake a worker
                # over and over until the trio thread removes the link.
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.modify(link.fd, select.EPOLLONESHOT)
            link.check_finished()
        inline: Call | None = None
        for call in calls:
            inline = self._carry(call, inline)
        if inline is not None:
            self._run_dsp(inline)

    def _arrive(self, link: Link, request: p.AnyRequest) -> Call | None:
        try:
            handler = link.arrive(request)
        except CodedError as exc:
            self._refuse_unstarted(link, request, exc)
            return None
        except Exception as exc:
            # A bug of ours in the arrival step: answer it, log it whole, keep serving.
            link.log.exception("request failed", request=p.tag_of(request), id=request.id)
            self._refuse_unstarted(link, request, _internal(exc))
            return None
        call = Call(handler, link)
        link.arrived(call)
        return call

    def _carry(self, call: Call, inline: Call | None) -> Call | None:
        """Send ``call`` on its way; returns the DSP call this worker runs itself."""
        gates = [gate for gate in call.handler.gates() if not gate.is_open]
        if gates:
            _when_all_open(gates, lambda: self._post(lambda: self._dispatch(call)))
            return inline
        route = call.handler.route
        if route is Route.HERE:
            self._execute(call)
            return inline
        if route is not Route.DSP:
            domain = call.handler.domain
            lane = {Route.CONTROL: domain.control, Route.LOADER: domain.loader}.get(
                route, domain.waits
            )
            # Users take turns on a domain's lanes: one user's eight big loads do not
            # go before another user's open.
            lane.submit(lambda: self._execute(call), fair_key=call.handler.client.uid)
            return inline
        if self._submit(call) and inline is None:
            return call
        if call.job is not None and call.job.state == "running":
            self._post(lambda: self._run_dsp(call))
        return inline

    def _dispatch(self, call: Call) -> None:
        """A call whose objects now exist goes on its way (from a worker)."""
        inline = self._carry(call, None)
        if inline is not None:
            self._run_dsp(inline)

    def _submit(self, call: Call) -> bool:
        """Hand a DSP call to the scheduler; True when it may run now."""
        handler = call.handler
        timing = handler.timing
        assert timing is not None  # a DSP-bound handler makes it at arrival
        assert timing.account is not None  # a welcomed client has one
        if call.link.hung_up:  # its objects came to exist after its client left
            self._release(call)
            return False
        job = Job(
            timing.account,
            payload=call,
            deadline=timing.deadline,
            explicit_deadline=timing.deadline is not None,
            doorbell=self.batches == "gated" and handler.doorbell,
        )
        call.job = job
        timeout = timing.timeout
        outcome = self.scheduler.submit(job)
        if outcome is Outcome.LATE:
            self._answer_error(call, _deadline_error(handler))
            self._end(call)
            return False
        if timeout is not None:
            call.timer = self.timers.call_later(timeout, lambda: self._time_out(call))
        if outcome is Outcome.QUEUED and timing.deadline is not None:
            self.timers.call_at(timing.deadline, self._refuse_late)
        if outcome is Outcome.QUEUED and job.bound is not None:
            recheck = self.scheduler.next_recheck()
            self.timers.call_at(job.bound if recheck is None else recheck, self._tick)
        return outcome is Outcome.RUN

    # --- running -------------------------------------------------------------------------
    def _run_dsp(self, call: Call) -> None:
        """Run a dispatched call here, answer it, then run what its slot lets start."""
        while True:
            job = call.job
            assert job is not None
            batch = self._batches.begin(call.handler, job)
            self._watchdog.watch(call)
            try:
                answer, error = self._run(call)
            finally:
                self._watchdog.unwatch(call)
            if batch is not None and error is None:
                self._batches.rung(batch)
            started: list[Job]
            late: list[Job]
            if batch is not None and batch.job is not None and error is None:
                started, late = [], []  # the batch holds the slot until its answer
            elif batch is not None and not self._batches.forget(batch):
                started, late = [], []  # its answer came already and finished it
            else:
                started, late = self.scheduler.finish(job, call.handler.dsp_seconds)
                call.handler.domain.charge_dsp(call.handler.dsp_seconds)
            if call.timer is not None:
                call.timer.cancel()
            self._deliver(call, answer, error)
            self._end(call)
            next_call = self._start_all(started, late, run_first_here=True)
            if next_call is None:
                return
            call = next_call

    def _start_all(
        self, started: list[Job], late: list[Job], *, run_first_here: bool = False
    ) -> Call | None:
        """Answer the ``late`` and run the ``started`` (the first here when asked: it is
        returned), as a finish or a tick gave them."""
        for refused in late:
            late_call: Call = refused.payload
            self._answer_error(late_call, _deadline_error(late_call.handler))
            self._end(late_call)
        calls: list[Call] = [job.payload for job in started]
        first = calls.pop(0) if calls and run_first_here else None
        for other in calls:
            self._post(functools.partial(self._run_dsp, other))
        return first

    def _tick(self) -> None:
        """A held doorbell's bound, or the moment the reason to hold it lapses (timer
        thread): start what may start now, and look again at the next such moment."""
        started, late = self.scheduler.tick()
        self._start_all(started, late)
        recheck = self.scheduler.next_recheck()
        if recheck is not None and recheck > time.monotonic():
            self.timers.call_at(recheck, self._tick)

    def _execute(self, call: Call) -> None:
        """Run a control or immediate request and answer it; a call that waited for the
        DSP (``Route.WAIT``: dspqueue's answer) ends its client's oldest open batch."""
        answer, error = self._run(call)
        answered = time.monotonic()
        self._deliver(call, answer, error)  # the answer first: the client waits for it
        timing = call.handler.timing
        account = None if timing is None else timing.account
        if call.handler.route is Route.WAIT and error is None and account is not None:
            handler = call.handler
            self._batches.answered(
                account, answered, handler.reported_dsp_seconds, domain=handler.domain
            )
        self._end(call)

    def _run(self, call: Call) -> tuple[Answer | None, CodedError | None]:
        handler = call.handler
        try:
            return handler.run(), None
        except CodedError as exc:
            return None, exc
        except Exception as exc:
            # A bug of ours: log it whole, answer the client, keep serving.
            call.link.log.exception(
                "request failed", request=p.tag_of(handler.request), id=handler.request.id
            )
            return None, _internal(exc)

    def _deliver(self, call: Call, answer: Answer | None, error: CodedError | None) -> None:
        fds = [answer.fd] if answer is not None and answer.fd is not None else []
        if not call.claim():  # the timeout answered already; what came back is dropped
            for fd in fds:
                fd.close()
            return
        if error is not None:
            self._send_refusal(call.link, call.handler.request, error)
        else:
            assert answer is not None
            call.link.send(answer.reply, fds)

    def _end(self, call: Call) -> None:
        """The request is over: its objects are let go, after its answer went out."""
        try:
            call.handler.end()
        finally:
            call.link.ended(call)

    # --- a client gone ---------------------------------------------------------------------
    def release_queued(self, link: Link) -> None:
        """``link``'s client is gone (PROTOCOL.md section 5; its owner's ``hung_up``): its
        DSP calls still waiting for a slot never run. Running ones finish; calls waiting
        for an object to exist are released when they would be submitted."""
        with link.lock:
            pending = [call for call in link.pending if isinstance(call, Call)]
        released = 0
        for call in pending:
            job = call.job
            if job is not None and self.scheduler.cancel(job):
                self._release(call)
                released += 1
        if released:
            link.log.info("client gone: its queued calls released", calls=released)

    def _release(self, call: Call) -> None:
        """End a call nobody will read the answer of, without running it."""
        if call.timer is not None:
            call.timer.cancel()
        call.claim()
        self._end(call)

    # --- answers that are not the work's -------------------------------------------------
    def _time_out(self, call: Call) -> None:
        """A call's timeout passed: a queued call is taken out, a running one answered
        (it goes on: the DSP may be using its memory)."""
        handler = call.handler
        assert handler.timing is not None  # only a timed call has a timeout
        error = CodedError(
            ErrorCode.TIMEOUT,
            operation=p.tag_of(handler.request),
            timeout_ms=handler.timing.timeout_ms,
        )
        job = call.job
        if job is not None and self.scheduler.cancel(job):
            self._answer_error(call, error)
            self._end(call)
        elif self.claim_and_refuse(call, error):
            call.link.log.info("call timed out on the DSP; it goes on", id=handler.request.id)

    # --- the watchdog: calls that never return ----------------------------------------
    def _report_hung(self, call: Call) -> None:
        """The watchdog found ``call`` on the DSP past ``call_watchdog`` (timer thread)."""
        request = call.handler.request
        call.link.log.error(
            "a DSP call never returned; ending its domain's DSP process and restarting it",
            request=p.tag_of(request),
            id=request.id,
            domain=call.handler.domain.name,
            seconds=self.call_watchdog,
        )
        tag = p.tag_of(request)
        self._on_hung(call.handler, f"a {tag} did not return within {self.call_watchdog:g} s")

    def _refuse_late(self) -> None:
        for job in self.scheduler.late_jobs():
            call: Call = job.payload
            self._answer_error(call, _deadline_error(call.handler))
            self._end(call)

    def claim_and_refuse(self, call: Call, error: CodedError) -> bool:
        if not call.claim():
            return False
        self._send_refusal(call.link, call.handler.request, error)
        return True

    def _answer_error(self, call: Call, error: CodedError) -> None:
        self.claim_and_refuse(call, error)

    def _refuse_unstarted(self, link: Link, request: p.AnyRequest, error: CodedError) -> None:
        self._send_refusal(link, request, error)

    def _send_refusal(self, link: Link, request: p.AnyRequest, error: CodedError) -> None:
        """The one place where a refusal becomes the request's ``error`` reply."""
        held = link.log_budget.take()
        if held is not None:
            link.log.info(
                "request refused",
                request=p.tag_of(request),
                id=request.id,
                code=error.code.name,
                error=str(error),
                **log_fields(held),
            )
        link.send(p.ErrorMessage.for_code(error.code, id=request.id, **error.fields))
        if error.code is ErrorCode.NOT_PERMITTED:
            link.note_not_permitted()

    def fail_unanswered(self, link: Link, error: CodedError) -> None:
        """Shutdown past its grace: answer every request still without one."""
        with link.lock:
            calls = [call for call in link.pending if isinstance(call, Call)]
        for call in calls:
            self.claim_and_refuse(call, error)


def _internal(exc: Exception) -> CodedError:
    return CodedError(ErrorCode.INTERNAL_ERROR, detail=type(exc).__name__)


def _deadline_error(handler: Handler[Any]) -> CodedError:
    timing = handler.timing
    return CodedError(
        ErrorCode.DEADLINE_EXCEEDED,
        operation=p.tag_of(handler.request),
        deadline_ms=None if timing is None else timing.deadline_ms,
    )


def _when_all_open(gates: list[Gate], callback: Callable[[], None]) -> None:
    """Run ``callback`` once every gate is open (on the thread that opens the last)."""
    remaining = [len(gates)]
    lock = threading.Lock()

    def one_opened() -> None:
        with lock:
            remaining[0] -= 1
            done = remaining[0] == 0
        if done:
            callback()

    for gate in gates:
        gate.when_open(one_opened)

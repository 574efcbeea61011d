"""Op batches (dspqueue) on the DSP: their gating and their charge.

A dspqueue doorbell (``signal``, an op batch of llama.cpp) is a DSP call; with
``batches = "gated"`` the batch it starts keeps its slot until the client's
``wait`` call brings the answer (or ``batch_answer_max`` passes), and the DSP
time the DSP reported with the answer (the emulator's does, a device's kernel
does not: ``Driver.dsp_report``), else doorbell-to-answer less the path's round
trip, is charged as the batch's DSP time; with ``"counted"`` the doorbell ends
as a call and the batch's time is only charged. :class:`OpBatches` keeps the
open batches of every client for the data path (:mod:`npud.datapath.workers`),
which tells it when a doorbell goes, returns, fails, and when an answer comes.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import structlog

from npud.requests import Handler
from npud.runtime.scheduler import Account, Job, Scheduler
from npud.runtime.timers import Timers

if TYPE_CHECKING:
    from npud.domain.life import Domain

log = structlog.get_logger("npud.datapath.workers")

EARLY_ANSWER_MAX: Final = 0.1
"""Seconds within which an answer that found no batch open is taken for the client's next
doorbell (the DSP took that batch from the ring before npud passed its doorbell on; the
doorbell may have been held by the gate, up to ``batch_hold_max_s``, meanwhile)."""
DOORBELL_TRIPS: Final = 32
"""Doorbells of a client whose fastest gives the path's round trip (a batch's charge
leaves it out): a window, so that a slower path (a loaded host) is followed."""


class Batch:
    """An op batch on the DSP: its doorbell was passed on, its answer has not come."""

    __slots__ = ("account", "domain", "ended", "job", "started", "trip")

    def __init__(self, account: Account, domain: Domain, job: Job | None, started: float) -> None:
        self.account = account
        self.domain = domain
        self.job = job  # holds a slot until the answer (gated), or None (counted)
        self.started = started
        """When its doorbell was sent."""
        self.trip = 0.0
        """The trips in its doorbell-to-answer that are not the DSP's: the client's
        fastest recent doorbell (:meth:`OpBatches.rung`)."""
        self.ended = False


class OpBatches:
    """The batches on the DSP, per client; ``on_finish`` takes what a gated batch's
    end lets start (the scheduler's ``finish``: jobs started and jobs late)."""

    def __init__(
        self,
        scheduler: Scheduler,
        timers: Timers,
        *,
        answer_max: float,
        on_finish: Callable[[list[Job], list[Job]], object],
    ) -> None:
        self.scheduler = scheduler
        self.timers = timers
        self.answer_max = answer_max
        self._on_finish = on_finish
        self._open: dict[Account, deque[Batch]] = {}
        """Batches on the DSP per client, oldest first (under ``_lock``)."""
        self._lock = threading.Lock()
        self._timer_armed = False
        """A timer will look for batches past ``answer_max`` (one for all of them: a
        batch costs no timer of its own)."""
        self._doorbell_trips: weakref.WeakKeyDictionary[Account, deque[float]] = (
            weakref.WeakKeyDictionary()
        )
        """Each client's recent doorbell round trips (under ``_lock``; gone with its
        account)."""
        self._early: weakref.WeakKeyDictionary[Account, float] = weakref.WeakKeyDictionary()
        """When a client's answer last found no batch open, until its next doorbell takes
        it (under ``_lock``): at most one per client, so a client whose answers outrun its
        doorbells gains one ungated slot-free batch at most."""
        self.early_answers = 0
        """Answers that came before their doorbell was passed on, since start."""

    def begin(self, handler: Handler[Any], job: Job) -> Batch | None:
        """A doorbell goes on: its batch is open from now until the client's next answer
        (its charge leaves the path's round trip out: :meth:`rung`). None when the call
        is no doorbell."""
        if not handler.doorbell:
            return None
        timing = handler.timing
        assert timing is not None  # an invoke's: made at its arrival
        assert timing.account is not None  # a welcomed client has one
        batch = Batch(
            timing.account, handler.domain, job if job.doorbell else None, time.monotonic()
        )
        with self._lock:
            trips = self._doorbell_trips.get(batch.account)
            batch.trip = min(trips) if trips else 0.0  # if its answer comes before it returns
            early = self._early.pop(batch.account, None)
            if early is not None and batch.started - early <= EARLY_ANSWER_MAX:
                # Its answer came already: the DSP ran the batch before this doorbell was
                # passed on. Opening it would pair every later answer with the batch
                # before its own (one behind for the rest of the run: each batch
                # charged its successor's time, and a gated one holding its slot a
                # batch too long). It ends as a call, when the doorbell returns.
                batch.job = None
                batch.ended = True
                return batch
            self._open.setdefault(batch.account, deque()).append(batch)
            arm = not self._timer_armed
            self._timer_armed = True
        if arm:
            self.timers.call_at(batch.started + self.answer_max, self._expire)
        return batch

    def rung(self, batch: Batch) -> None:
        """The doorbell returned. A batch is charged from its doorbell's sending to its
        answer's arrival less the two trips in that which are not the DSP's: the
        doorbell's way there, and the answer's way back. A doorbell is a call that does
        nothing on the DSP, so its own time is those two trips; its return is not when
        the DSP took the batch (the batch may run before the DSP process's reply goes
        out, so a slow return measures the batch, not the path). The client's fastest
        doorbell of the last :data:`DOORBELL_TRIPS` is the path's round trip, left out
        of the charge. Doorbell-to-answer alone counted 1.18 times the DSP's own count
        of llama.cpp's batches (issue 28); from the doorbell's return, about 0.8."""
        returned = time.monotonic()
        with self._lock:
            trips = self._doorbell_trips.get(batch.account)
            if trips is None:
                trips = self._doorbell_trips[batch.account] = deque(maxlen=DOORBELL_TRIPS)
            trips.append(returned - batch.started)
            if not batch.ended:
                batch.trip = min(trips)

    def _expire(self) -> None:
        """The timer (timer thread): batches past ``answer_max`` give their slot back;
        the timer is set again for the oldest of the others."""
        now = time.monotonic()
        with self._lock:
            batches = [batch for queue in self._open.values() for batch in queue]
        for batch in batches:
            if now - batch.started >= self.answer_max:
                self._end(batch, expired=True)
        with self._lock:
            oldest = min(
                (queue[0].started for queue in self._open.values() if queue),
                default=None,
            )
            self._timer_armed = oldest is not None
        if oldest is not None:
            self.timers.call_at(oldest + self.answer_max, self._expire)

    def forget(self, batch: Batch) -> bool:
        """The doorbell failed (or is counted, not gated): a gated batch is no longer
        waited for. False when its answer came already (the batch was finished)."""
        if batch.job is None:
            return True  # counted: its answer charges it; the call finishes as a call
        with self._lock:
            if batch.ended:
                return False
            batch.ended = True
            queue = self._open[batch.account]
            queue.remove(batch)
            if not queue:
                del self._open[batch.account]
        return True

    def answered(
        self,
        account: Account,
        when: float,
        reported: float | None = None,
        *,
        domain: Domain | None = None,
    ) -> None:
        """A ``wait`` call of ``account`` returned at ``when``: the oldest open batch is
        over. ``reported``: the DSP time the DSP told with the answer (the work it did
        for the packets it answers, ``Driver.dsp_report``), charged instead of the
        estimate; with no batch open (the DSP took a packet from the ring before npud
        passed its doorbell on) it is charged to the client and ``domain`` all the same,
        and the client's next doorbell within :data:`EARLY_ANSWER_MAX` is taken as
        answered (:meth:`begin`)."""
        with self._lock:
            open_batches = self._open.get(account)
            batch = open_batches[0] if open_batches else None
            if batch is None and reported:
                # The DSP did work for it: a batch's answer that outran its doorbell (a
                # cancelled wait, or one ending the queue, reports none and is not).
                # Without a report (a device's kernel) the answer cannot be told from
                # those, and answers pair with doorbells in order only.
                self._early[account] = when
                self.early_answers += 1
        if batch is not None:
            self._end(batch, expired=False, when=when, reported=reported)
        elif reported:
            self.scheduler.charge(account, reported)
            if domain is not None:
                domain.charge_dsp(reported)

    def _end(
        self,
        batch: Batch,
        *,
        expired: bool,
        when: float | None = None,
        reported: float | None = None,
    ) -> None:
        with self._lock:
            if batch.ended:
                return
            batch.ended = True
            open_batches = self._open[batch.account]
            open_batches.remove(batch)
            if not open_batches:
                del self._open[batch.account]
        spent = (time.monotonic() if when is None else when) - batch.started
        if expired:
            seconds = spent
        elif reported is not None:
            seconds = reported  # the DSP's own count: no estimate of the path needed
        else:
            seconds = max(0.0, spent - batch.trip)
        if expired:
            log.warning(
                "an op batch's answer did not come: its slot is given back",
                client=batch.account.name,
                after_s=round(seconds, 3),
            )
        batch.domain.charge_dsp(seconds)
        if batch.job is None:
            self.scheduler.charge(batch.account, seconds)
            return
        started, late = self.scheduler.finish(batch.job, seconds)
        self._on_finish(started, late)

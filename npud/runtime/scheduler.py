"""The one home of arbitration: which DSP-bound call is dispatched next, and when.

A FastRPC call cannot be preempted once it is on the DSP (no NPU runtime can
switch mid-graph), so arbitration is about what is dispatched, when, and how
much may run at once. The policy (docs/scheduling.md):

* **Slots.** At most ``dsp_slots`` calls are on the DSP at once. Normal and
  background calls together leave ``realtime_reserve`` slots to realtime, but
  a reserved slot is lent to a call predicted (by its client's typical DSP
  time) to end before a realtime client would need it; background calls hold
  at most ``background_max`` while a normal call waits. No slot stays idle
  unless a promise needs it (work-conserving).
* **Order.** Class first (realtime, normal, background); within a class,
  calls with a deadline go earliest-deadline first, then clients take turns
  by **measured DSP time** (each client's virtual time grows by the DSP time
  its calls used; the client furthest behind goes next), then arrival.
* **No starvation.** A background call that has waited ``background_wait``
  seconds goes before normal calls (realtime still first).
* **Per client**, at most ``per_client_running`` calls are on the DSP at once.
* **Deadlines.** A call whose deadline passed before dispatch is not
  dispatched (``DEADLINE_EXCEEDED``); one that finishes late counts a miss.
* **Budgets.** A realtime client may declare a period and a budget of DSP
  time per period; it is admitted only while the declared realtime use stays
  under ``realtime_utilisation``. Its use is a leaky bucket draining at the
  budget's rate; calls made while it holds a budget or more (its calls still
  running counted at their time so far, at least their typical time) run as
  normal class until it drains below: they take the reserve only
  as a normal call may and never while a normal call waits, and the client has
  at most one call on the DSP meanwhile. Calls without a deadline get the end
  of their period as one (for ordering and misses, never for refusal).
* **Batches.** A dspqueue doorbell (``signal``: llama.cpp's op batch) is a job
  like a call, but the batch it starts holds its slot until its answer comes
  (``finish`` then charges doorbell-to-answer as its DSP time). A background
  client's doorbell also waits while a realtime call is running or queued (with
  ``batch_yield = "normal"``, a normal call too), or due (calling in rhythm: on its
  grid, :class:`~npud.runtime.rhythm.Rhythm`) before the batch would end (its typical
  time, longer beside other calls), less ``batch_overlap`` of its budget, or overdue;
  the time held is kept by reason (:class:`Hold`, the status row's ``held``). It goes at
  once otherwise, and never waits longer than ``batch_hold_max``
  (:meth:`Scheduler.tick` starts it then, whatever the slots, or sooner when
  the realtime client it was held for turns quiet: :meth:`Scheduler.next_recheck`).
* **FIFO mode** turns all of it off: arrival order, ``dsp_slots`` at once, so
  benchmarks can measure the difference in one run.

The scheduler is pure bookkeeping: it never runs a call. ``submit`` says
whether a call may start now; ``finish`` returns the calls that may start
because one ended. It is thread-safe (one lock; every method is short) and
takes its clock from the caller, so tests drive it with a fake one.
"""

from __future__ import annotations

import enum
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from npud.runtime import rhythm
from npud.runtime.budgets import AdmissionRefusedError, Bucket, Budget, check_admission
from npud.runtime.gate import Hold, hold_batch, normal_hold_ends, predicted_batch
from npud.runtime.rhythm import Rhythm
from npud.runtime.utilisation import BusySlots

__all__ = [
    "BACKGROUND",
    "CLASSES",
    "NORMAL",
    "REALTIME",
    "Account",
    "AdmissionRefusedError",
    "Budget",
    "Hold",
    "Job",
    "Outcome",
    "Policy",
    "Scheduler",
    "SchedulerStatistics",
]
CLASSES: Final = ("realtime", "normal", "background")
REALTIME, NORMAL, BACKGROUND = range(3)
WAIT_SAMPLES: Final = 1024
"""Queue waits kept per client for the percentiles (the most recent ones)."""
TYPICAL_CALL_WEIGHT: Final = 0.25
"""How much a call's DSP time moves its client's typical call (an exponential average)."""


class Outcome(enum.Enum):
    """What ``submit`` decided."""

    RUN = "run"
    """Dispatched: the caller runs it now."""
    QUEUED = "queued"
    """Waiting; a later ``finish`` (or ``cancel``) returns it."""
    LATE = "late"
    """Its deadline had passed: not dispatched (DEADLINE_EXCEEDED)."""


@dataclass(frozen=True)
class Policy:
    """The knobs of ``[scheduler]`` (npud/ops/config.py documents each)."""

    mode: Literal["fair", "fifo"] = "fair"
    dsp_slots: int = 4
    realtime_reserve: int = 1
    background_max: int = 2
    background_wait: float = 0.5
    per_client_running: int = 2
    realtime_utilisation: float = 0.5
    realtime_utilisation_per_owner: float = 0.25
    """The share of the DSP one owner's (uid's) declared budgets may take together."""
    realtime_default_budget: Budget | None = None
    """What a realtime client that declares no budget is admitted with (None: unbounded)."""
    batch_hold_max: float = 0.05
    """Seconds a background client's doorbell may be held for realtime work, at most."""
    batch_overlap: float = 0.25
    """The share of a realtime client's budget a background batch may be predicted to
    still run into its next call for (0: a batch due to end after the call comes waits)."""
    batch_yield: Literal["normal", "realtime"] = "normal"
    """The least class whose calls on the DSP hold a background client's doorbell:
    ``normal`` (the calls of every client above background: a normal TTS's graph too) or
    ``realtime`` (realtime calls only; a batch then shares the DSP with normal calls)."""

    def __post_init__(self) -> None:
        if self.dsp_slots < 1:
            raise ValueError("dsp_slots must be at least 1")
        if not 0 <= self.realtime_reserve < self.dsp_slots:
            raise ValueError("realtime_reserve must leave at least one slot for the others")
        if self.background_max < 1:
            raise ValueError("background_max must be at least 1")
        if not self.batch_hold_max > 0:
            raise ValueError("batch_hold_max must be positive")
        if not 0 <= self.batch_overlap <= 1:
            raise ValueError("batch_overlap must be within 0..1 (a share of a budget)")
        if self.batch_yield not in ("normal", "realtime"):
            raise ValueError(
                f"batch_yield must be 'normal' or 'realtime', not {self.batch_yield!r}"
            )


@dataclass(eq=False)
class Account:
    """One client as the scheduler sees it."""

    name: str
    klass: int
    budget: Budget | None = None
    owner: int = -1
    """Whose (a uid): realtime budgets are capped per owner too."""
    vtime: float = 0.0
    """DSP seconds used, as the fairness clock of its class sees them."""
    queued: int = 0
    running: int = 0
    calls: int = 0
    dsp_seconds: float = 0.0
    misses: int = 0
    """Calls that finished after their deadline."""
    late: int = 0
    """Calls refused because their deadline had passed before dispatch."""
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=WAIT_SAMPLES))
    bucket: Bucket | None = None
    """Its budget's use (PROTOCOL.md section 8); None without a budget."""
    closed: bool = False
    throttled_until: float = -math.inf
    """A call of this client hung: until then its calls run one at a time, as background."""
    typical_call: float | None = None
    """Its calls' DSP time, a moving average (None before its first call returned): what a
    call of it is predicted to take when it would borrow a slot kept for realtime."""
    rhythm: Rhythm = field(default_factory=Rhythm)
    """When its calls arrived as realtime lately: when its next is expected."""
    batch_holds: dict[Hold, tuple[int, float]] = field(default_factory=dict)
    """Its doorbells the gate held for realtime work, by the first reason each was held
    for: how many (counted when each went) and their seconds held in all."""
    _queue: deque[Job] = field(default_factory=deque)
    _running_jobs: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget is not None and self.bucket is None:
            self.bucket = Bucket(self.budget)

    @property
    def overruns(self) -> int:
        """Times its use went beyond its budget (0 without one)."""
        return self.bucket.overruns if self.bucket is not None else 0

    @property
    def throttled(self) -> bool:
        return time.monotonic() < self.throttled_until

    def wait_percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of recent queue waits, in seconds; 0 with none."""
        if not self.waits:
            return 0.0
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(eq=False)
class Job:
    """One DSP-bound call."""

    account: Account
    payload: Any = None
    """Whatever the caller runs (the request's handler)."""
    deadline: float | None = None
    """Absolute, on the scheduler's clock; None: no deadline."""
    explicit_deadline: bool = False
    """The client asked for this deadline (only those refuse a late dispatch)."""
    arrival: float = 0.0
    seq: int = 0
    klass: int = NORMAL
    """The class this call runs in (a budgeted client over its budget runs as normal)."""
    dispatched: float | None = None
    state: Literal["new", "queued", "running", "done", "cancelled"] = "new"
    doorbell: bool = False
    """A dspqueue doorbell: the batch it starts holds the slot until ``finish``."""
    over_budget: bool = False
    """A realtime client's call beyond its budget (it runs as normal)."""
    bound: float | None = None
    """A doorbell starts by then, whatever the slots (set at ``submit``)."""
    held: Hold | None = None
    """Why the gate first held this doorbell (None: it was not held for realtime work)."""


@dataclass(frozen=True)
class SchedulerStatistics:
    mode: str
    dsp_slots: int
    queued: tuple[int, int, int]
    running: tuple[int, int, int]
    utilisation: float
    """Recent average of busy slots / ``dsp_slots``, 0..1."""
    realtime_declared: float
    """Sum of the admitted realtime budgets' shares of the DSP."""
    dispatched: int
    late: int


class Scheduler:
    """See the module docstring."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._accounts: set[Account] = set()
        self._queued = [0, 0, 0]
        self._running = [0, 0, 0]
        self._seq = itertools.count()
        self._fifo: deque[Job] = deque()
        self._dispatched = 0
        self._late = 0
        self._busy = BusySlots(clock())
        self._running_total = 0
        self.calls_done = 0
        """Calls finished (:meth:`finish`) since start."""

    # --- clients ---------------------------------------------------------------
    def open_account(
        self, name: str, klass: int, budget: Budget | None = None, owner: int = -1
    ) -> Account:
        """A client of ``owner`` (a uid) joins; a realtime budget is admitted or refused
        here. A realtime client that declares none gets the policy's default budget."""
        with self._lock:
            if budget is not None and klass != REALTIME:
                raise AdmissionRefusedError("only realtime clients declare a budget")
            if budget is None and klass == REALTIME:
                budget = self.policy.realtime_default_budget
            if budget is not None:
                self._admit(budget, owner)
            account = Account(name, klass, budget, owner)
            actives = [a for a in self._accounts if a.klass == klass]
            account.vtime = min((a.vtime for a in actives), default=0.0)
            self._accounts.add(account)
            return account

    def close_account(self, account: Account) -> list[Job]:
        """A client leaves: its queued calls are taken out (returned, for the caller
        to answer and release); its running calls finish as usual."""
        with self._lock:
            account.closed = True
            dropped = [job for job in self._all_queued() if job.account is account]
            for job in dropped:
                self._unqueue(job)
                job.state = "cancelled"
            self._accounts.discard(account)
            return dropped

    # --- calls -------------------------------------------------------------------
    def submit(self, job: Job) -> Outcome:
        """A call arrives. RUN: start it now. QUEUED: ``finish`` will return it."""
        with self._lock:
            now = self._clock()
            account = job.account
            job.arrival = now
            job.seq = next(self._seq)
            job.klass = self._class_of(account, now)
            job.over_budget = account.klass == REALTIME and job.klass == NORMAL
            if job.deadline is None and account.budget is not None and job.klass == REALTIME:
                job.deadline = now + account.budget.period
            if self._is_late(job, now):
                self._refuse_late(job)
                return Outcome.LATE
            if account.klass == REALTIME and account.budget is not None:
                account.rhythm.arrived(now, account.budget.period)  # over budget or not
            if job.doorbell:
                job.bound = now + self.policy.batch_hold_max
            if account.queued == 0 and account.running == 0:
                self._catch_up(account)
            # After every event no queued call fits (each finish starts all that
            # do), so a call that fits now takes nothing from one that waits.
            if self._fits(job):
                self._start(job, now)
                return Outcome.RUN
            job.state = "queued"
            account.queued += 1
            self._queued[job.klass] += 1
            if self.policy.mode == "fifo":
                self._fifo.append(job)
            else:
                account._queue.append(job)
            return Outcome.QUEUED

    def finish(self, job: Job, dsp_seconds: float) -> tuple[list[Job], list[Job]]:
        """A dispatched call returned after ``dsp_seconds`` on the DSP.

        Returns (calls to start now, calls refused as late): the caller runs the
        first and answers the second with DEADLINE_EXCEEDED.
        """
        with self._lock:
            now = self._clock()
            self._note_busy(now)
            account = job.account
            job.state = "done"
            self.calls_done += 1
            self._running[job.klass] -= 1
            self._running_total -= 1
            account.running -= 1
            if job in account._running_jobs:
                account._running_jobs.remove(job)
            account.calls += 1
            account.dsp_seconds += dsp_seconds
            account.vtime += dsp_seconds
            typical = account.typical_call
            account.typical_call = (
                dsp_seconds
                if typical is None
                else typical + TYPICAL_CALL_WEIGHT * (dsp_seconds - typical)
            )
            if job.deadline is not None and now > job.deadline:
                account.misses += 1
            if account.bucket is not None:
                account.bucket.charge(dsp_seconds, now)
            return self._dispatch(now)

    def charge(self, account: Account, dsp_seconds: float) -> None:
        """DSP time used outside any slot (a batch whose doorbell was not held for its
        answer, ``[scheduler] batches = "counted"``): fairness and budgets count it."""
        with self._lock:
            now = self._clock()
            account.dsp_seconds += dsp_seconds
            account.vtime += dsp_seconds
            if account.bucket is not None:
                account.bucket.charge(dsp_seconds, now)

    def tick(self) -> tuple[list[Job], list[Job]]:
        """Start what may start now: doorbells held to their bound, and those held for a
        realtime call that did not come. Returns what ``finish`` does; the caller runs
        it at every queued doorbell's ``bound``."""
        with self._lock:
            return self._dispatch(self._clock())

    def next_bound(self) -> float | None:
        """The earliest ``bound`` of a queued doorbell (None: none queued)."""
        with self._lock:
            return min(
                (job.bound for job in self._all_queued() if job.bound is not None),
                default=None,
            )

    def next_recheck(self) -> float | None:
        """When a queued doorbell should be looked at again (None: none queued): its
        bound, or sooner, when its wait for normal work ends (``gate.NORMAL_HOLD_SHARE``),
        or when a realtime client it may be held for (calling in rhythm, due or overdue)
        turns quiet without having called: the reason to hold it lapses then, and nothing
        else (a call's ``submit`` or ``finish``) would start it."""
        with self._lock:
            held = [job for job in self._all_queued() if job.bound is not None]
            if not held:
                return None
            now = self._clock()
            when = min(job.bound for job in held if job.bound is not None)
            if self._yields_to_normal():  # its wait for normal work ends
                hold_max = self.policy.batch_hold_max
                lapses = (normal_hold_ends(job.arrival, hold_max) for job in held)
                when = min([when, *(t for t in lapses if t > now)])
            for account in self._accounts:
                budget = account.budget
                if account.klass != REALTIME or budget is None or account.closed:
                    continue
                quiet = rhythm.quiet_from(account.rhythm.last, budget.period)
                if now < quiet < when:
                    when = quiet
            return when

    def cancel(self, job: Job) -> bool:
        """Take a queued call out (its caller gave up); False if it is not queued."""
        with self._lock:
            if job.state != "queued":
                return False
            self._unqueue(job)
            job.state = "cancelled"
            return True

    def late_jobs(self) -> list[Job]:
        """Queued calls whose explicit deadline has passed: taken out, to be refused."""
        with self._lock:
            now = self._clock()
            late = [job for job in self._all_queued() if self._is_late(job, now)]
            for job in late:
                self._unqueue(job)
                self._refuse_late(job)
            return late

    def statistics(self) -> SchedulerStatistics:
        with self._lock:
            now = self._clock()
            self._note_busy(now)
            return SchedulerStatistics(
                mode=self.policy.mode,
                dsp_slots=self.policy.dsp_slots,
                queued=(self._queued[0], self._queued[1], self._queued[2]),
                running=(self._running[0], self._running[1], self._running[2]),
                utilisation=self._busy.utilisation(now, self.policy.dsp_slots),
                realtime_declared=sum(b.share for b in self._declared()),
                dispatched=self._dispatched,
                late=self._late,
            )

    # --- policy ---------------------------------------------------------------------
    def throttle(self, account: Account, seconds: float) -> None:
        """``account``'s calls run one at a time, in the background class, for ``seconds``
        (a call of it hung): it can no longer hold slots others need."""
        with self._lock:
            account.throttled_until = max(account.throttled_until, self._clock() + seconds)

    def _class_of(self, account: Account, now: float) -> int:
        if now < account.throttled_until:
            return BACKGROUND
        if self.policy.mode == "fifo":
            return NORMAL
        bucket = account.bucket
        if bucket is not None and account.klass == REALTIME:
            # Over budget until it drains: no more precedence.
            return NORMAL if bucket.full(self._in_flight(account, now), now) else REALTIME
        return account.klass

    def _in_flight(self, account: Account, now: float) -> float:
        """What ``account``'s calls on the DSP will have used: each its time so far, at
        least the client's typical call (its budget before one was measured)."""
        assert account.budget is not None
        floor = account.typical_call if account.typical_call is not None else account.budget.budget
        return sum(
            max(now - (job.dispatched if job.dispatched is not None else now), floor)
            for job in account._running_jobs
        )

    def _fits(self, job: Job) -> bool:
        """May ``job`` start now, as far as slots and caps go? Work-conserving: a slot is
        kept idle only where a call it could run would make a promise fail (see
        :meth:`_may_borrow` and docs/scheduling.md)."""
        policy, running = self.policy, self._running
        if self._running_total >= policy.dsp_slots:
            return False
        if policy.mode == "fifo":
            return True
        now = self._clock()
        # A throttled client, and a realtime one past its budget, run one call at a time.
        throttled = now < job.account.throttled_until or job.over_budget
        cap = 1 if throttled else policy.per_client_running
        if job.account.running >= cap:
            return False
        if job.klass == REALTIME:
            return True
        if job.doorbell and job.klass == BACKGROUND:
            hold = self._why_hold(job, now)
            if hold is not None:
                if job.held is None:
                    job.held = hold
                return False
        itself = 1 if job.state == "queued" and job.klass == NORMAL else 0
        others_wait = self._queued[NORMAL] > itself
        normal_waits = (job.klass == BACKGROUND or job.over_budget) and others_wait
        if normal_waits and running[BACKGROUND] >= policy.background_max:
            return False  # the background cap keeps room for normal calls while one waits
        if running[NORMAL] + running[BACKGROUND] < policy.dsp_slots - policy.realtime_reserve:
            return True
        # Only slots kept for realtime are free: lend one if the call will be over in time.
        return not normal_waits and self._may_borrow(job, now)

    def _may_borrow(self, job: Job, now: float) -> bool:
        """May ``job`` take a slot kept for realtime? Its client's typical DSP time says
        when it would end, and it must end before any other realtime client would wait
        too long for the slot (:func:`npud.runtime.rhythm.loan_must_end_by`). A client
        whose calls were never measured does not borrow."""
        predicted = job.account.typical_call
        if predicted is None:
            return False
        latest = math.inf
        for account in self._accounts:
            if (
                (account is job.account and not job.over_budget)
                or account.klass != REALTIME
                or account.budget is None
                or account.closed
            ):
                continue
            budget = account.budget
            latest = min(
                latest,
                rhythm.loan_must_end_by(account.rhythm, budget.period, budget.budget, now),
            )
        return now + predicted <= latest

    def _why_hold(self, job: Job, now: float) -> Hold | None:
        """Why a batch of ``job``'s client started now would run beside work it yields to
        (:func:`npud.runtime.gate.hold_batch`), or None."""
        realtime = (
            (account.rhythm, account.budget)
            for account in self._accounts
            if account.klass == REALTIME and account.budget is not None and not account.closed
        )
        normal_ends = normal_hold_ends(job.arrival, self.policy.batch_hold_max)
        beside = self._running_total - job.account.running
        return hold_batch(
            realtime_on_dsp=bool(self._running[REALTIME] or self._queued[REALTIME]),
            normal_on_dsp=self._yields_to_normal() and now < normal_ends,
            realtime=realtime,
            batch=predicted_batch(job.account.typical_call or 0.0, beside),
            overlap=self.policy.batch_overlap,
            now=now,
        )

    def _yields_to_normal(self) -> bool:
        """A normal call is on the DSP (running or queued) that batches wait for."""
        normal = self._running[NORMAL] or self._queued[NORMAL]
        return self.policy.batch_yield == "normal" and bool(normal)

    def _dispatch(self, now: float) -> tuple[list[Job], list[Job]]:
        started: list[Job] = []
        late: list[Job] = []
        for held in self._all_queued():
            if held.bound is not None and now >= held.bound:
                self._unqueue(held)  # held to its bound: it goes now, whatever the slots
                self._start(held, now)
                started.append(held)
        while True:
            job = self._pick(now)
            if job is None:
                return started, late
            self._unqueue(job)
            if self._is_late(job, now):
                self._refuse_late(job)
                late.append(job)
                continue
            self._start(job, now)
            started.append(job)

    def _pick(self, now: float) -> Job | None:
        if self.policy.mode == "fifo":
            return self._fifo[0] if self._fifo and self._fits(self._fifo[0]) else None
        order = [REALTIME, NORMAL, BACKGROUND]
        if self._queued[BACKGROUND] and self._starving_background(now):
            order = [REALTIME, BACKGROUND, NORMAL]
        for klass in order:
            if self._queued[klass]:
                job = self._pick_in_class(klass)
                if job is not None:
                    return job
        return None

    def _pick_in_class(self, klass: int) -> Job | None:
        """Earliest deadline first, then the client furthest behind in DSP time, then arrival."""
        best: Job | None = None
        best_key: tuple[float, float, int] | None = None
        for account in self._accounts:
            # Every queued call of the class, not the client's first: one client's
            # calls with deadlines go earliest first too (PROTOCOL.md section 8).
            # Whether a call fits depends on its client and class only: ask once.
            mine = [
                ((math.inf if job.deadline is None else job.deadline, account.vtime, job.seq), job)
                for job in account._queue
                if job.klass == klass
            ]
            if not mine:
                continue
            key, job = min(mine, key=lambda entry: entry[0])
            if (best_key is None or key < best_key) and self._fits(job):
                best, best_key = job, key
        return best

    def _starving_background(self, now: float | None = None) -> bool:
        now = self._clock() if now is None else now
        oldest = min(
            (
                job.arrival
                for account in self._accounts
                for job in account._queue
                if job.klass == BACKGROUND
            ),
            default=math.inf,
        )
        return now - oldest >= self.policy.background_wait

    def _catch_up(self, account: Account) -> None:
        """A client that was idle starts from its class's current virtual time, so
        idleness is not banked as credit against clients that kept working."""
        busy = [
            a.vtime
            for a in self._accounts
            if a.klass == account.klass and a is not account and (a.queued or a.running)
        ]
        if busy:
            account.vtime = max(account.vtime, min(busy))

    def _start(self, job: Job, now: float) -> None:
        self._note_busy(now)
        job.state = "running"
        job.dispatched = now
        job.account.running += 1
        job.account._running_jobs.append(job)
        job.account.waits.append(now - job.arrival)
        if job.held is not None:
            holds = job.account.batch_holds
            batches, seconds = holds.get(job.held, (0, 0.0))
            holds[job.held] = (batches + 1, seconds + now - job.arrival)
        self._running[job.klass] += 1
        self._running_total += 1
        self._dispatched += 1

    def _is_late(self, job: Job, now: float) -> bool:
        return job.explicit_deadline and job.deadline is not None and now > job.deadline

    def _refuse_late(self, job: Job) -> None:
        job.state = "cancelled"
        job.account.late += 1
        self._late += 1

    def _unqueue(self, job: Job) -> None:
        if self.policy.mode == "fifo":
            self._fifo.remove(job)
        else:
            job.account._queue.remove(job)
        job.account.queued -= 1
        self._queued[job.klass] -= 1

    def _all_queued(self) -> list[Job]:
        if self.policy.mode == "fifo":
            return list(self._fifo)
        return [job for account in self._accounts for job in account._queue]

    def _declared(self, owner: int | None = None) -> list[Budget]:
        """The admitted budgets (of ``owner``, if given)."""
        return [
            a.budget
            for a in self._accounts
            if a.budget is not None and (owner is None or a.owner == owner)
        ]

    def _admit(self, budget: Budget, owner: int) -> None:
        check_admission(
            budget,
            declared=self._declared(),
            declared_by_owner=None if owner < 0 else self._declared(owner),
            bound=self.policy.realtime_utilisation,
            bound_per_owner=self.policy.realtime_utilisation_per_owner,
        )

    def demote(self, account: Account) -> None:
        """``account`` may no longer be realtime (a reload took its user off the list):
        its calls run as normal from now on, and its budget is given back."""
        with self._lock:
            if account.klass != REALTIME:
                return
            account.klass = NORMAL
            account.budget = None
            account.bucket = None

    def _note_busy(self, now: float) -> None:
        self._busy.note(now, self._running_total)

"""The DSP's compute, shared: work that runs at once slows each other down.

A real NPU does not get faster with more work in flight: calls and the DSP
processes' own threads (an htp session's op batches) share its vector and
tensor units. Without a model of that, an emulated ``busy(20 ms)`` takes 20 ms
however many run beside it, and no scheduler can be measured against the
emulator (more slots would simply mean more throughput).

:class:`SharedCompute` is processor sharing over two kinds of unit, one model
for every DSP process of a channel (the device's DSP):

* ``units`` (``SimConfig.dsp_units``): the HVX contexts. Every piece of work
  holds one while it runs; with ``n`` pieces working, each progresses at most
  at ``units / n`` of full speed.
* ``hmx_units`` (``SimConfig.hmx_units``): the HMX matrix unit (one on the
  device). *Matrix* work (a graph of convolutions or matrix products, an op
  batch with MUL_MAT) also needs it: with ``m`` matrix pieces working, each
  progresses at most at ``hmx_units / m``.

A piece progresses at the smallest of 1 and the shares of the units it needs,
so the work done per second never exceeds either count. ``0`` turns a kind
off (unlimited); both ``0`` (the default) is the emulator's behaviour before
the model: everything runs as if alone.

Work is asked for in two ways: :meth:`SharedCompute.work` (``seconds`` of
work, returns when done: the busy skel's calls) and :meth:`SharedCompute.begin`
/ :meth:`SharedCompute.end`, for code that computes on the host's CPUs and
is charged what it took: a piece joins the model at ``begin`` (others slow
down from then on), its demand is told at ``end`` (the host CPU time it took),
and ``end`` returns once the model has credited that much, at once when it
had the DSP alone. A subsystem restart interrupts every wait, and the end of
the calling process interrupts its own (as ending a hung DSP process does).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from npud.sim.errors import ProcessExitedError, SubsystemDownError

POLL: float = 0.05
"""Seconds between a waiting piece's looks at a restart or its process's end."""
BACKDATE_MAX: float = 0.25
"""Seconds a piece's start may lie before :meth:`SharedCompute.begin` is told of it."""


class Cancellation(Protocol):
    """What ends a call's work early: the process's end (a ``threading.Event``, or
    anything that answers ``is_set``; it is asked at least every 50 ms)."""

    def is_set(self) -> bool: ...


class _Work:
    __slots__ = ("done", "matrix", "need", "started")

    def __init__(self, seconds: float, matrix: bool = False, started: float = 0.0) -> None:
        self.need = seconds  # inf while begun and not ended
        self.done = 0.0
        self.matrix = matrix
        self.started = started

    @property
    def remaining(self) -> float:
        return self.need - self.done


class Job:
    """A piece of work begun with :meth:`SharedCompute.begin`, its demand not known yet."""

    __slots__ = ("_work", "done_credit", "ended")

    def __init__(self, work: _Work) -> None:
        self._work = work
        self.ended = False
        self.done_credit = 0.0
        """Work credited so far (set at :meth:`SharedCompute.end`)."""


class SharedCompute:
    """Processor sharing over ``units`` HVX contexts and ``hmx_units`` HMX units
    (0: unlimited); see the module docstring. Thread-safe."""

    def __init__(
        self,
        units: int,
        down: threading.Event,
        clock: Callable[[], float] = time.monotonic,
        hmx_units: int = 0,
    ) -> None:
        if units < 0:
            raise ValueError("units must be 0 (unlimited) or more")
        if hmx_units < 0:
            raise ValueError("hmx_units must be 0 (unlimited) or more")
        self.units = units
        self.hmx_units = hmx_units
        self._down = down
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._active: list[_Work] = []
        self._matrix = 0
        self._since = clock()
        self.busy_seconds = 0.0
        """Wall time during which some work was active (the DSP's own busy count)."""

    @property
    def modelled(self) -> bool:
        """Sharing is modelled (some unit count is not 0)."""
        return bool(self.units or self.hmx_units)

    def work(
        self, seconds: float, cancelled: Cancellation | None = None, *, matrix: bool = False
    ) -> None:
        """Do ``seconds`` of work, sharing the units; SubsystemDownError on a restart,
        ProcessExitedError when ``cancelled`` is set (the calling process ended)."""
        if seconds <= 0:
            return
        if not self.modelled:
            self._sleep_until(self._clock() + seconds, cancelled)
            return
        job = _Work(seconds, matrix)
        with self._cond:
            self._join_locked(job)
            self._wait_locked(job, cancelled)

    def begin(self, *, matrix: bool = False, started: float | None = None) -> Job:
        """A piece of work starts now, its demand told at :meth:`end`. ``started``: when
        it really started (a time of this clock, at most :data:`BACKDATE_MAX` ago): a
        DSP process's piece is told through a call's thread, and the time that took is
        credited at once, at the piece's rate now, rather than waited for again at its
        end (the piece ran meanwhile)."""
        with self._cond:
            now = self._clock()
            lag = 0.0 if started is None else min(max(0.0, now - started), BACKDATE_MAX)
            work = _Work(math.inf, matrix, now - lag)
            if self.modelled:
                self._join_locked(work)
                work.done = lag * self._rate(work)
            return Job(work)

    def end(self, job: Job, seconds: float, cancelled: Cancellation | None = None) -> None:
        """The piece begun as ``job`` needs ``seconds`` in all: wait until the model has
        credited that much (at once when it had the DSP alone). Errors as :meth:`work`;
        on any exit the piece leaves the model."""
        work = job._work
        if job.ended:
            return
        job.ended = True
        if not self.modelled:
            job.done_credit = min(seconds, self._clock() - work.started)
            self._sleep_until(work.started + seconds, cancelled)
            return
        with self._cond:
            self._advance()
            job.done_credit = min(seconds, work.done)
            work.need = seconds
            self._wait_locked(work, cancelled)

    def drop(self, job: Job) -> None:
        """Abandon ``job`` (its process or carrier went): it leaves the model now."""
        if job.ended:
            return
        job.ended = True
        if not self.modelled:
            return
        with self._cond:
            self._advance()
            self._leave_locked(job._work)

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._active)

    # -- internals ---------------------------------------------------------------------------

    def _sleep_until(self, deadline: float, cancelled: Cancellation | None) -> None:
        while (left := deadline - self._clock()) > 0:
            if self._down.wait(min(left, POLL)):
                raise SubsystemDownError
            if cancelled is not None and cancelled.is_set():
                raise ProcessExitedError

    def _join_locked(self, job: _Work) -> None:
        self._advance()
        self._active.append(job)
        if job.matrix:
            self._matrix += 1
        self._cond.notify_all()  # everyone's share just shrank

    def _leave_locked(self, job: _Work) -> None:
        if job in self._active:
            self._active.remove(job)
            if job.matrix:
                self._matrix -= 1
            self._cond.notify_all()  # everyone's share just grew

    def _wait_locked(self, job: _Work, cancelled: Cancellation | None) -> None:
        try:
            while job.remaining > 1e-9:
                if self._down.is_set():
                    raise SubsystemDownError
                if cancelled is not None and cancelled.is_set():
                    raise ProcessExitedError
                # Wake at the finish, or when the set changes (notify), and at most
                # every 50 ms to notice a restart.
                self._cond.wait(min(job.remaining / self._rate(job), POLL))
                self._advance()
        finally:
            self._advance()
            self._leave_locked(job)

    def _rate(self, job: _Work) -> float:
        rate = 1.0
        if self.units:
            rate = min(rate, self.units / len(self._active))
        if job.matrix and self.hmx_units:
            rate = min(rate, self.hmx_units / self._matrix)
        return rate

    def _advance(self) -> None:
        """Credit every active piece with the work done since the last change."""
        now = self._clock()
        elapsed, self._since = now - self._since, now
        if not self._active or elapsed <= 0:
            return
        self.busy_seconds += elapsed
        for job in self._active:
            job.done += elapsed * self._rate(job)

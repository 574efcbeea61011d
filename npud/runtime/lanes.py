"""Lanes: dedicated long-lived threads that run blocking work off the trio thread.

Nothing blocking runs on the trio thread. A :class:`LanePool` is a few threads
on one queue. Each domain keeps its own (``control`` for buffers and mappings,
``loader`` for opens and model loads, ``waits`` for calls that wait on the DSP
without a slot), so that an allocation never waits behind a model load and one
domain's trouble never holds another's; the device keeps a ``closer``. Users
take turns on a pool (``fair_key``): one user's queue of big loads does not go
before another user's open. DSP calls themselves do not run on lanes: the data
path's workers run them as the scheduler dispatches them (docs/architecture.md).

A dedicated thread is used rather than ``trio.to_thread.run_sync``: the
thread hop costs several times more per call on these machines, and lanes
let us block signals once so that a signal never interrupts an ioctl.

Cancellation never abandons a running call: a job that has started runs to
completion and its caller waits for it (shielded), because the DSP may be
using memory the caller owns. A job still in the queue is dropped.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import outcome
import structlog
import trio

log = structlog.get_logger(__name__)

T = TypeVar("T")

_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class LaneTimeoutError(Exception):
    """The caller stopped waiting; a job already running goes on."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no result within {seconds:g} s")
        self.seconds = seconds


class _Job(Generic[T]):
    __slots__ = ("done", "fn", "lock", "on_abandoned", "result", "state", "token")

    def __init__(self, fn: Callable[[], T], token: trio.lowlevel.TrioToken | None) -> None:
        self.fn = fn
        self.token = token  # None: nobody waits (submit)
        self.done = trio.Event()
        self.lock = threading.Lock()
        self.state = _QUEUED
        self.result: outcome.Outcome[T] | None = None
        # Set when the waiter timed out while the job ran: the lane hands the
        # result to it, so nothing the job created is lost.
        self.on_abandoned: Callable[[T], object] | None = None


@dataclass(frozen=True)
class LaneStatistics:
    name: str
    threads: int
    queued: int
    running: int
    completed: int
    oldest_running_seconds: float


class LanePool:
    """``threads`` lane threads sharing one queue ordered by (priority, arrival)."""

    def __init__(self, name: str, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("a lane pool needs at least one thread")
        self.name = name
        # Jobs wait in a heap ordered by (priority, turn, arrival); every job put in
        # also puts one wake-up token in a SimpleQueue, on which idle threads
        # block. SimpleQueue is C code: a hand-off costs about a quarter of a
        # queue.PriorityQueue's, which is most of a short invoke's overhead.
        # A job's turn takes turns between submitters (``fair_key``): each key's
        # next job comes one turn after its last, and no earlier than the turn now
        # being served, so a key with many jobs waiting is served in turn with the
        # others instead of before them (start-time fair queueing, by jobs).
        self._heap: list[tuple[int, int, int, _Job[object] | None]] = []
        self._turn_now = 0
        self._next_turn: dict[object, int] = {}
        self._heap_lock = threading.Lock()
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._seq = itertools.count()
        self._threads = [
            threading.Thread(target=self._run, name=f"lane-{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        self._lock = threading.Lock()
        self._running_since: dict[int, float] = {}
        self._completed = 0
        self._started = False
        self._stop_waiting = False

    def start(self) -> None:
        self._started = True
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Let queued jobs finish, end the threads; True if they all ended in time."""
        if not self._started:
            return True
        for _ in self._threads:
            # Sorts after every real job: the threads drain the queue first.
            self._put(1 << 62, None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        return not any(thread.is_alive() for thread in self._threads)

    async def call(
        self,
        fn: Callable[[], T],
        *,
        priority: int = 0,
        timeout: float | None = None,
        on_abandoned: Callable[[T], object] | None = None,
    ) -> T:
        """Run ``fn`` on a lane thread and return its result (or raise its exception).

        ``timeout``: give up waiting after this many seconds with
        :class:`LaneTimeoutError`; a job that has not started is dropped, a running
        one goes on (its memory is owned by the job, not by the waiter).
        Cancellation waits for a running job. ``on_abandoned`` receives the
        result of a job that completed after its caller went away (timed out or
        cancelled), so what it created can be released; it runs on a lane.
        """
        job: _Job[T] = _Job(fn, trio.lowlevel.current_trio_token())
        self._put(priority, job)  # type: ignore[arg-type]
        try:
            if timeout is None:
                await job.done.wait()
            else:
                with trio.move_on_after(timeout):
                    await job.done.wait()
        except trio.Cancelled:
            if self._drop_if_queued(job):
                raise
            with trio.CancelScope(shield=True):
                while not job.done.is_set() and not self._stop_waiting:
                    with trio.move_on_after(0.1):
                        await job.done.wait()
            if job.done.is_set():
                self._abandon(job, on_abandoned)
            else:
                self._hand_over(job, on_abandoned)
            raise
        if not job.done.is_set():
            self._hand_over(job, on_abandoned)
            raise LaneTimeoutError(timeout or 0.0)
        assert job.result is not None
        return job.result.unwrap()

    def submit(
        self, fn: Callable[[], object], *, priority: int = 0, fair_key: object = None
    ) -> None:
        """Run ``fn`` on a lane without waiting; its failure is logged, not raised.
        ``fair_key``: whose job it is (a uid); jobs of different keys take turns."""

        def logged() -> None:
            try:
                fn()
            except Exception:
                log.exception("lane job failed", lane=self.name)

        self._put(priority, _Job(logged, None), fair_key)

    def _put(self, priority: int, job: _Job[object] | None, fair_key: object = None) -> None:
        with self._heap_lock:
            turn = max(self._turn_now, self._next_turn.get(fair_key, 0))
            self._next_turn[fair_key] = turn + 1
            if len(self._next_turn) > 1024:  # keys long served: forget them
                self._next_turn = {
                    key: due for key, due in self._next_turn.items() if due > self._turn_now
                }
            heapq.heappush(self._heap, (priority, turn, next(self._seq), job))
        self._tokens.put(None)

    @staticmethod
    def _drop_if_queued(job: _Job[T]) -> bool:
        with job.lock:
            if job.state == _QUEUED:
                job.state = _CANCELLED
                return True
            return False

    def stop_waiting(self) -> None:
        """Shutdown past its grace: cancelled callers stop waiting for running jobs.

        The jobs go on (their memory is theirs; the session pins buffers), and
        what they return goes to their ``on_abandoned``.
        """
        self._stop_waiting = True

    def _hand_over(self, job: _Job[T], on_abandoned: Callable[[T], object] | None) -> None:
        """The caller leaves: drop a queued job, or have the lane deliver a running one's result."""
        with job.lock:
            finished_meanwhile = job.state == _DONE
            if job.state == _QUEUED:
                job.state = _CANCELLED
            elif job.state == _RUNNING:
                job.on_abandoned = on_abandoned  # the lane delivers the result to it
        if finished_meanwhile:
            self._abandon(job, on_abandoned)

    def _abandon(self, job: _Job[T], on_abandoned: Callable[[T], object] | None) -> None:
        if on_abandoned is None or job.result is None or not isinstance(job.result, outcome.Value):
            return
        value = job.result.value
        self.submit(lambda: on_abandoned(value))

    def statistics(self) -> LaneStatistics:
        now = time.monotonic()
        with self._lock:
            running = list(self._running_since.values())
            completed = self._completed
        return LaneStatistics(
            name=self.name,
            threads=len(self._threads),
            queued=len(self._heap),
            running=len(running),
            completed=completed,
            oldest_running_seconds=max((now - t for t in running), default=0.0),
        )

    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def _run(self) -> None:
        # Signals go to the main thread; an ioctl on a lane is never interrupted.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        ident = threading.get_ident()
        while True:
            self._tokens.get()
            with self._heap_lock:
                _, turn, _, job = heapq.heappop(self._heap)
                self._turn_now = max(self._turn_now, turn)
            if job is None:
                return
            with job.lock:
                if job.state == _CANCELLED:
                    continue
                job.state = _RUNNING
            with self._lock:
                self._running_since[ident] = time.monotonic()
            result = outcome.capture(job.fn)
            with self._lock:
                del self._running_since[ident]
                self._completed += 1
            with job.lock:
                job.result = result
                job.state = _DONE
                on_abandoned, job.on_abandoned = job.on_abandoned, None
            if on_abandoned is not None and isinstance(result, outcome.Value):
                self.submit(functools.partial(on_abandoned, result.value))
            if job.token is not None:
                # The trio run may have ended (daemon shutting down): nobody waits.
                with contextlib.suppress(trio.RunFinishedError):
                    job.token.run_sync_soon(job.done.set)

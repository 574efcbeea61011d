"""An op batch's answer that outran its doorbell (issue 28): the DSP took the packet from
the ring before npud passed the doorbell on. npud.datapath.batches takes the client's
next doorbell as answered, so later answers pair with their own batches, not the one
before (they had stayed one behind for the rest of a run)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from npud.datapath.batches import EARLY_ANSWER_MAX, OpBatches
from npud.runtime.scheduler import BACKGROUND, Account, Job, Outcome, Policy, Scheduler
from npud.runtime.timers import Timers


class Domain:
    def __init__(self) -> None:
        self.charged = 0.0

    def charge_dsp(self, seconds: float) -> None:
        self.charged += seconds


@pytest.fixture
def timers() -> Iterator[Timers]:
    timers = Timers("test-batches")
    timers.start()
    yield timers
    assert timers.stop(5)


def _setup(timers: Timers) -> tuple[OpBatches, Scheduler, Account, Any]:
    scheduler = Scheduler(Policy())
    batches = OpBatches(scheduler, timers, answer_max=60.0, on_finish=lambda *_: None)
    account = scheduler.open_account("llm", BACKGROUND)
    handler = SimpleNamespace(
        doorbell=True, timing=SimpleNamespace(account=account), domain=Domain()
    )
    return batches, scheduler, account, handler


def _doorbell(scheduler: Scheduler, account: Account) -> Job:
    job = Job(account, doorbell=True)
    assert scheduler.submit(job) is Outcome.RUN
    return job


def test_a_reported_answer_before_its_doorbell_answers_that_doorbell(timers: Timers) -> None:
    batches, scheduler, account, handler = _setup(timers)
    batches.answered(account, time.monotonic(), 0.004, domain=handler.domain)
    first = batches.begin(handler, _doorbell(scheduler, account))
    assert first is not None
    assert first.ended  # answered already: it ends as a call when its doorbell returns
    assert first.job is None
    assert batches.forget(first)  # the data path then finishes its job as a call's
    second = batches.begin(handler, _doorbell(scheduler, account))
    assert second is not None
    assert not second.ended  # the next one waits for its own answer...
    batches.answered(account, time.monotonic(), 0.005, domain=handler.domain)
    assert second.ended  # ...and gets it, not the first's
    assert batches.early_answers == 1
    assert account.dsp_seconds == pytest.approx(0.009)  # both reports, once each


def test_an_answer_without_a_report_is_no_batchs(timers: Timers) -> None:
    """A cancelled wait, or one that ends the queue, reports no DSP time: the next
    doorbell's batch waits for its answer as ever."""
    batches, scheduler, account, handler = _setup(timers)
    batches.answered(account, time.monotonic(), None, domain=handler.domain)
    batches.answered(account, time.monotonic(), 0.0, domain=handler.domain)
    batch = batches.begin(handler, _doorbell(scheduler, account))
    assert batch is not None
    assert not batch.ended
    assert batches.early_answers == 0


def test_an_early_answer_is_kept_for_a_short_while_only(timers: Timers) -> None:
    batches, scheduler, account, handler = _setup(timers)
    long_ago = time.monotonic() - 2 * EARLY_ANSWER_MAX
    batches.answered(account, long_ago, 0.004, domain=handler.domain)
    batch = batches.begin(handler, _doorbell(scheduler, account))
    assert batch is not None
    assert not batch.ended


def test_early_answers_answer_one_doorbell_at_most(timers: Timers) -> None:
    """A client whose answers outrun its doorbells gains one slot-free batch, not one per
    answer."""
    batches, scheduler, account, handler = _setup(timers)
    for _ in range(3):
        batches.answered(account, time.monotonic(), 0.004, domain=handler.domain)
    first = batches.begin(handler, _doorbell(scheduler, account))
    second = batches.begin(handler, _doorbell(scheduler, account))
    assert first is not None
    assert second is not None
    assert first.ended
    assert not second.ended

"""Every rule of the scheduler, deterministically: a fake clock, DSP time given by the test."""

from __future__ import annotations

import pytest

from npud.runtime.scheduler import (
    BACKGROUND,
    NORMAL,
    REALTIME,
    AdmissionRefusedError,
    Budget,
    Job,
    Outcome,
    Policy,
    Scheduler,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, **policy: object) -> Scheduler:
    return Scheduler(Policy(**policy), clock)  # type: ignore[arg-type]


def job(scheduler: Scheduler, account: object, deadline: float | None = None) -> Job:
    return Job(account, deadline=deadline, explicit_deadline=deadline is not None)  # type: ignore[arg-type]


def test_fifo_runs_in_arrival_order_up_to_the_slots(clock: Clock) -> None:
    s = make(clock, mode="fifo", dsp_slots=2)
    llm, voice = s.open_account("llm", BACKGROUND), s.open_account("voice", REALTIME)
    jobs = [job(s, llm), job(s, llm), job(s, llm), job(s, voice)]
    assert [s.submit(j) for j in jobs] == [Outcome.RUN, Outcome.RUN, Outcome.QUEUED, Outcome.QUEUED]
    started, _ = s.finish(jobs[0], 0.02)
    assert started == [jobs[2]]  # the older background call, though voice is realtime
    started, _ = s.finish(jobs[1], 0.02)
    assert started == [jobs[3]]
    assert s.calls_done == 2  # what the daemon reports as calls answered


def test_classes_go_in_order_when_a_slot_frees(clock: Clock) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=0, background_max=2, per_client_running=9)
    bg, normal, rt = (
        s.open_account(n, k) for n, k in (("b", BACKGROUND), ("n", NORMAL), ("r", REALTIME))
    )
    running = [job(s, bg), job(s, bg)]
    assert [s.submit(j) for j in running] == [Outcome.RUN, Outcome.RUN]
    waiting = [job(s, bg), job(s, normal), job(s, rt)]
    assert [s.submit(j) for j in waiting] == [Outcome.QUEUED] * 3
    assert s.finish(running[0], 0.01)[0] == [waiting[2]]  # realtime first
    assert s.finish(running[1], 0.01)[0] == [waiting[1]]  # then normal
    assert s.finish(waiting[2], 0.01)[0] == [waiting[0]]  # background last


def test_background_and_normal_leave_the_reserve_to_realtime(clock: Clock) -> None:
    s = make(clock, dsp_slots=3, realtime_reserve=1, background_max=5, per_client_running=9)
    bg, normal, rt = (
        s.open_account(n, k) for n, k in (("b", BACKGROUND), ("n", NORMAL), ("r", REALTIME))
    )
    assert s.submit(job(s, bg)) is Outcome.RUN
    assert s.submit(job(s, normal)) is Outcome.RUN
    assert s.submit(job(s, normal)) is Outcome.QUEUED  # only the reserved slot is left
    assert s.submit(job(s, bg)) is Outcome.QUEUED
    assert s.submit(job(s, rt)) is Outcome.RUN  # a realtime call always finds a slot
    assert s.statistics().running == (1, 1, 1)


def test_background_holds_at_most_background_max_while_normal_calls_wait(clock: Clock) -> None:
    s = make(clock, dsp_slots=4, realtime_reserve=1, background_max=2, per_client_running=9)
    bg, normal = s.open_account("b", BACKGROUND), s.open_account("n", NORMAL)
    first = [job(s, bg) for _ in range(2)]
    assert [s.submit(j) for j in first] == [Outcome.RUN, Outcome.RUN]
    assert s.submit(job(s, normal)) is Outcome.RUN  # normal still finds room
    waiting_normal = job(s, normal)
    assert s.submit(waiting_normal) is Outcome.QUEUED  # only the reserve is left
    assert s.submit(job(s, bg)) is Outcome.QUEUED  # a normal call waits: the cap holds
    started, _ = s.finish(first[0], 0.02)
    assert started[0] is waiting_normal  # then the background one, on the idle reserve


def test_with_no_normal_call_waiting_background_uses_every_slot_but_the_reserve(
    clock: Clock,
) -> None:
    """Work-conserving: background_max keeps room for normal calls, not idle slots."""
    s = make(clock, dsp_slots=4, realtime_reserve=1, background_max=2, per_client_running=9)
    bg = s.open_account("b", BACKGROUND)
    jobs = [job(s, bg) for _ in range(4)]
    assert [s.submit(j) for j in jobs] == [Outcome.RUN] * 3 + [Outcome.QUEUED]
    # Measured now (20 ms a call), and with no realtime client: the reserve is lent too.
    assert s.finish(jobs[0], 0.020)[0] == [jobs[3]]
    assert s.submit(job(s, bg)) is Outcome.RUN
    assert s.statistics().running == (0, 0, 4)


def test_the_reserve_is_lent_only_to_calls_that_end_before_realtime_needs_it(
    clock: Clock,
) -> None:
    """A realtime client (4 ms every 32 ms) can wait 28 ms for a slot: a background call
    typically 20 ms long borrows its reserved slot, one typically 40 ms long does not, and
    a client never measured does not."""
    s = make(clock, dsp_slots=2, realtime_reserve=1, background_max=2, per_client_running=9)
    voice = s.open_account("voice", REALTIME, Budget(period=0.032, budget=0.004))
    short, long_, new = (s.open_account(n, BACKGROUND) for n in ("short", "long", "new"))
    for account, seconds in ((short, 0.020), (long_, 0.040)):
        measured = job(s, account)
        assert s.submit(measured) is Outcome.RUN
        s.finish(measured, seconds)
    hold = job(s, new)
    assert s.submit(hold) is Outcome.RUN  # the unreserved slot
    assert s.submit(job(s, new)) is Outcome.QUEUED  # never measured: no loan
    assert s.submit(job(s, long_)) is Outcome.QUEUED  # 40 ms > 32 - 4
    lent = job(s, short)
    assert s.submit(lent) is Outcome.RUN  # 20 ms <= 28 ms
    # The realtime call that comes meanwhile waits for the loan, and is in time.
    rt = job(s, voice)
    assert s.submit(rt) is Outcome.QUEUED
    clock.now += 0.020
    assert s.finish(lent, 0.020)[0] == [rt]
    assert rt.deadline is not None
    assert clock.now + 0.004 <= rt.deadline
    # Right after a realtime arrival the next is a period away: a 40 ms call still waits.
    assert s.submit(job(s, long_)) is Outcome.QUEUED


def test_a_realtime_client_in_rhythm_waits_at_most_half_its_slack(clock: Clock) -> None:
    """Once a realtime client (4 ms every 32 ms: 28 ms of slack) calls in rhythm, a loan
    must end within half its slack after its next call is due (one period after its
    last): the call then waits 14 ms at most, and the host's own delays fit in the rest."""
    s = make(clock, dsp_slots=2, realtime_reserve=1, background_max=2, per_client_running=9)
    voice = s.open_account("voice", REALTIME, Budget(period=0.032, budget=0.004))
    llm = s.open_account("llm", BACKGROUND)
    measured = job(s, llm)
    assert s.submit(measured) is Outcome.RUN
    s.finish(measured, 0.020)
    hold = job(s, llm)
    assert s.submit(hold) is Outcome.RUN  # the unreserved slot
    call = job(s, voice)
    assert s.submit(call) is Outcome.RUN  # the reserve; voice calls at t0
    clock.now += 0.001
    s.finish(call, 0.001)
    early = job(s, llm)
    assert s.submit(early) is Outcome.RUN  # ends at t0 + 21 ms, before t0 + 32 + 14
    clock.now += 0.027
    s.finish(early, 0.020)
    late = job(s, llm)
    assert s.submit(late) is Outcome.QUEUED  # at t0 + 28 ms it would end at t0 + 48 ms
    clock.now += 0.004  # t0 + 32 ms: the voice call is due and finds the reserve free
    due = job(s, voice)
    assert s.submit(due) is Outcome.RUN
    clock.now += 0.001  # as soon as it is done, the next loan fits
    assert s.finish(due, 0.001)[0] == [late]


def test_a_realtime_client_over_its_budget_borrows_its_own_reserve(clock: Clock) -> None:
    """Its calls past its budget run as normal; they may take the reserve that is kept
    for it (a client need not leave a slot free for itself), and they keep its rhythm."""
    s = make(clock, dsp_slots=2, realtime_reserve=1, per_client_running=9)
    voice = s.open_account("voice", REALTIME, Budget(period=0.032, budget=0.004))
    other = s.open_account("other", NORMAL)
    busy = job(s, other)
    assert s.submit(busy) is Outcome.RUN  # the unreserved slot
    spent = job(s, voice)
    assert s.submit(spent) is Outcome.RUN
    clock.now += 0.005
    s.finish(spent, 0.005)  # its whole budget for this period, and more
    over = job(s, voice)
    assert s.submit(over) is Outcome.RUN  # as normal, on the reserve
    assert over.klass == NORMAL


def test_a_client_has_at_most_per_client_running_on_the_dsp(clock: Clock) -> None:
    s = make(clock, dsp_slots=4, realtime_reserve=0, per_client_running=2)
    greedy, other = s.open_account("greedy", NORMAL), s.open_account("other", NORMAL)
    greedy_jobs = [job(s, greedy) for _ in range(3)]
    assert [s.submit(j) for j in greedy_jobs] == [Outcome.RUN, Outcome.RUN, Outcome.QUEUED]
    assert s.submit(job(s, other)) is Outcome.RUN  # the greedy one's third call took no slot
    assert s.finish(greedy_jobs[0], 0.01)[0] == [greedy_jobs[2]]


def test_clients_of_a_class_share_by_dsp_time_not_by_calls(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0, per_client_running=1)
    heavy, light = s.open_account("heavy", NORMAL), s.open_account("light", NORMAL)
    first = job(s, heavy)
    assert s.submit(first) is Outcome.RUN
    heavy_next = [job(s, heavy) for _ in range(3)]
    light_next = [job(s, light) for _ in range(12)]
    for j in heavy_next + light_next:
        assert s.submit(j) is Outcome.QUEUED
    # heavy used 125 ms; light's 15.6 ms calls go until light has used as much
    # (binary fractions, so the sums are exact).
    order: list[str] = []
    current, cost = first, {"heavy": 0.125, "light": 0.015625}
    for _ in range(9):
        started, _ = s.finish(current, cost[current.account.name])
        (current,) = started
        order.append(current.account.name)
    assert order == ["light"] * 8 + ["heavy"]
    assert heavy.dsp_seconds == light.dsp_seconds == 0.125


def test_an_idle_client_does_not_bank_credit(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    worker, sleeper = s.open_account("worker", NORMAL), s.open_account("sleeper", NORMAL)
    current = job(s, worker)
    s.submit(current)
    for _ in range(50):  # the worker uses 5 s of DSP while the sleeper is idle
        nxt = job(s, worker)
        s.submit(nxt)
        (current,), _ = s.finish(current, 0.1)
    woken = [job(s, sleeper) for _ in range(3)]
    more = job(s, worker)
    for j in [*woken, more]:
        s.submit(j)
    # Without catch-up the sleeper would now hold the DSP for 5 s.
    order = []
    for _ in range(4):
        (current,), _ = s.finish(current, 0.1)
        order.append(current.account.name)
    assert "worker" in order[:3]


def test_deadlines_go_first_within_a_class(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0, per_client_running=1)
    a, b, c = (s.open_account(n, NORMAL) for n in "abc")
    running = job(s, a)
    s.submit(running)
    plain, soon, later = (
        job(s, b),
        job(s, c, deadline=clock.now + 1),
        job(s, a, deadline=clock.now + 5),
    )
    for j in (plain, later, soon):
        assert s.submit(j) is Outcome.QUEUED
    (first,), _ = s.finish(running, 0.001)
    (second,), _ = s.finish(first, 0.001)
    (third,), _ = s.finish(second, 0.001)
    assert [first, second, third] == [soon, later, plain]


def test_one_clients_deadlines_go_earliest_first(clock: Clock) -> None:
    """Not in arrival order: 6 s, 4 s and 5 s sent in one write run 4, 5, 6 (PROTOCOL.md 8)."""
    s = make(clock, dsp_slots=1, realtime_reserve=0, per_client_running=1)
    busy, client = s.open_account("busy", NORMAL), s.open_account("client", NORMAL)
    running = job(s, busy)
    s.submit(running)
    six, four, five = (job(s, client, clock.now + d) for d in (6, 4, 5))
    plain = job(s, client)
    for j in (plain, six, four, five):
        assert s.submit(j) is Outcome.QUEUED
    order = []
    current = running
    for _ in range(4):
        (current,), _ = s.finish(current, 0.001)
        order.append(current)
    assert order == [four, five, six, plain]


def test_a_call_past_its_deadline_is_not_dispatched(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    a = s.open_account("a", NORMAL)
    assert s.submit(job(s, a, deadline=clock.now - 0.001)) is Outcome.LATE
    running = job(s, a)
    s.submit(running)
    waiting = job(s, a, deadline=clock.now + 0.05)
    assert s.submit(waiting) is Outcome.QUEUED
    clock.now += 0.1
    started, late = s.finish(running, 0.1)
    assert (started, late) == ([], [waiting])
    assert a.late == 2
    assert s.statistics().late == 2


def test_late_queued_calls_are_found_without_waiting_for_a_slot(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    a = s.open_account("a", NORMAL)
    s.submit(job(s, a))
    waiting = [job(s, a, deadline=clock.now + 0.01), job(s, a)]
    for j in waiting:
        s.submit(j)
    assert s.late_jobs() == []
    clock.now += 0.02
    assert s.late_jobs() == [waiting[0]]
    assert s.statistics().queued == (0, 1, 0)


def test_finishing_after_the_deadline_is_a_miss_not_a_failure(clock: Clock) -> None:
    s = make(clock)
    a = s.open_account("a", NORMAL)
    late = job(s, a, deadline=clock.now + 0.01)
    assert s.submit(late) is Outcome.RUN
    clock.now += 0.02
    s.finish(late, 0.02)
    assert (a.misses, a.late, a.calls) == (1, 0, 1)


def test_background_waiting_too_long_goes_before_normal(clock: Clock) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=1, background_max=1, background_wait=0.5)
    bg, normal = s.open_account("b", BACKGROUND), s.open_account("n", NORMAL)
    running = job(s, normal)
    s.submit(running)
    starving = job(s, bg)
    assert s.submit(starving) is Outcome.QUEUED
    fresh = job(s, normal)
    s.submit(fresh)
    clock.now += 0.6  # past background_wait
    started, _ = s.finish(running, 0.6)
    assert started[0] is starving  # first; the normal one may borrow the idle reserve after it


def test_without_waiting_long_background_stays_behind_normal(clock: Clock) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=1, background_max=1, background_wait=0.5)
    bg, normal = s.open_account("b", BACKGROUND), s.open_account("n", NORMAL)
    running = job(s, normal)
    s.submit(running)
    waiting_bg, waiting_normal = job(s, bg), job(s, normal)
    s.submit(waiting_bg)
    s.submit(waiting_normal)
    clock.now += 0.1
    assert s.finish(running, 0.1)[0] == [waiting_normal]


def test_budgets_are_admitted_under_the_bound(clock: Clock) -> None:
    s = make(clock, realtime_utilisation=0.5)
    s.open_account("vad", REALTIME, Budget(period=0.032, budget=0.004))  # 12.5 %
    s.open_account("stt", REALTIME, Budget(period=0.1, budget=0.03))  # 30 %
    with pytest.raises(AdmissionRefusedError, match="would bring declared realtime use to 55%"):
        s.open_account("tts", REALTIME, Budget(period=0.1, budget=0.0125))
    with pytest.raises(AdmissionRefusedError, match="only realtime"):
        s.open_account("llm", BACKGROUND, Budget(period=1, budget=0.1))
    assert s.statistics().realtime_declared == pytest.approx(0.425)


def test_one_user_cannot_declare_more_than_its_share(clock: Clock) -> None:
    """One user's 50% budget used to shut another user's voice client out (issue 16,
    item 6): each user's declarations are capped on their own."""
    s = make(clock, realtime_utilisation=0.5, realtime_utilisation_per_owner=0.25)
    s.open_account("mine-1", REALTIME, Budget(period=0.1, budget=0.02), owner=1000)
    with pytest.raises(AdmissionRefusedError, match="this user's declared realtime use to 30%"):
        s.open_account("greedy", REALTIME, Budget(period=0.1, budget=0.01), owner=1000)
    with pytest.raises(AdmissionRefusedError, match="above the 25% one user may declare"):
        s.open_account("greedier", REALTIME, Budget(period=0.1, budget=0.03), owner=1001)
    s.open_account("voice", REALTIME, Budget(period=0.032, budget=0.004), owner=1001)
    assert s.statistics().realtime_declared == pytest.approx(0.325)


def test_a_realtime_client_without_a_budget_gets_the_default_one(clock: Clock) -> None:
    default = Budget(period=0.032, budget=0.004)
    s = make(clock, realtime_default_budget=default, realtime_utilisation_per_owner=0.3)
    account = s.open_account("unbudgeted", REALTIME, owner=1000)
    assert account.budget == default
    assert s.open_account("normal", NORMAL, owner=1000).budget is None
    s.open_account("second", REALTIME, owner=1000)  # 25% of the DSP in all for this user
    with pytest.raises(AdmissionRefusedError, match="one user may declare"):
        s.open_account("third", REALTIME, owner=1000)


def test_a_demoted_account_runs_as_normal_and_gives_its_budget_back(clock: Clock) -> None:
    s = make(clock, realtime_utilisation=0.5)
    account = s.open_account("voice", REALTIME, Budget(period=0.1, budget=0.05))
    s.demote(account)
    assert (account.klass, account.budget) == (NORMAL, None)
    assert s.statistics().realtime_declared == 0
    s.demote(account)  # again: nothing more
    assert account.klass == NORMAL


def test_a_closed_account_frees_its_budget(clock: Clock) -> None:
    s = make(clock, realtime_utilisation=0.5)
    first = s.open_account("vad", REALTIME, Budget(period=0.1, budget=0.05))
    with pytest.raises(AdmissionRefusedError):
        s.open_account("vad2", REALTIME, Budget(period=0.1, budget=0.05))
    s.close_account(first)
    s.open_account("vad2", REALTIME, Budget(period=0.1, budget=0.05))


def test_a_realtime_client_over_its_budget_runs_as_normal_until_its_next_period(
    clock: Clock,
) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=1)
    vad = s.open_account("vad", REALTIME, Budget(period=0.032, budget=0.004))
    first = job(s, vad)
    assert s.submit(first) is Outcome.RUN
    assert first.klass == REALTIME
    assert first.deadline == pytest.approx(clock.now + 0.032)  # the period's end
    assert not first.explicit_deadline
    s.finish(first, 0.005)  # more than the 4 ms budget
    assert vad.overruns == 1
    second = job(s, vad)
    s.submit(second)
    assert second.klass == NORMAL
    s.finish(second, 0.001)
    clock.now += 0.033
    third = job(s, vad)
    s.submit(third)
    assert third.klass == REALTIME


def test_cancel_and_close_take_queued_calls_out(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    a, b = s.open_account("a", NORMAL), s.open_account("b", NORMAL)
    running = job(s, a)
    s.submit(running)
    mine, theirs = job(s, a), job(s, b)
    s.submit(mine)
    s.submit(theirs)
    assert s.cancel(theirs)
    assert not s.cancel(theirs)
    assert not s.cancel(running)
    assert s.close_account(a) == [mine]
    assert s.finish(running, 0.01)[0] == []
    assert s.statistics().queued == (0, 0, 0)


def test_utilisation_follows_the_busy_slots(clock: Clock) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=0)
    a = s.open_account("a", NORMAL)
    assert s.statistics().utilisation == 0.0
    jobs = [job(s, a), job(s, a)]
    for j in jobs:
        s.submit(j)
    clock.now += 60  # both slots busy for a long while
    assert s.statistics().utilisation == pytest.approx(1.0, abs=0.01)
    for j in jobs:
        s.finish(j, 60)
    clock.now += 60
    assert s.statistics().utilisation == pytest.approx(0.0, abs=0.01)


def test_queue_waits_are_kept_per_client(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    a = s.open_account("a", NORMAL)
    running = job(s, a)
    s.submit(running)
    waiting = job(s, a)
    s.submit(waiting)
    clock.now += 0.25
    s.finish(running, 0.25)
    assert sorted(a.waits) == [0.0, 0.25]
    assert a.wait_percentile(0.99) == 0.25
    assert a.wait_percentile(0.5) == 0.25


@pytest.mark.parametrize(
    "policy",
    [{"dsp_slots": 0}, {"dsp_slots": 2, "realtime_reserve": 2}, {"background_max": 0}],
)
def test_policies_that_cannot_work_are_refused(policy: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must"):
        Policy(**policy)  # type: ignore[arg-type]


# --- budgets as PROTOCOL.md section 8 says (issue 28, item 4) ---------------------------------

VAD_BUDGET = Budget(period=0.032, budget=0.004)


def test_a_call_past_the_budget_does_not_take_the_reserve_while_a_normal_call_waits(
    clock: Clock,
) -> None:
    """Before, it took the reserve at once (answered in 1 ms while normal calls waited)."""
    s = make(clock, dsp_slots=2, realtime_reserve=1, per_client_running=9)
    voice = s.open_account("voice", REALTIME, VAD_BUDGET)
    tool, other = s.open_account("tool", NORMAL), s.open_account("other", NORMAL)
    busy = job(s, tool)
    assert s.submit(busy) is Outcome.RUN  # the unreserved slot
    spent = job(s, voice)
    assert s.submit(spent) is Outcome.RUN
    clock.now += 0.005
    s.finish(spent, 0.005)  # its whole budget for this period, and more
    waiting = job(s, other)
    assert s.submit(waiting) is Outcome.QUEUED  # never measured: it does not borrow
    over = job(s, voice)
    assert s.submit(over) is Outcome.QUEUED  # as normal: behind the normal call
    assert (over.klass, over.over_budget) == (NORMAL, True)
    clock.now += 0.001
    # The normal call first; then, with no normal call waiting, it may borrow the reserve.
    assert s.finish(busy, 0.006)[0] == [waiting, over]


def test_a_client_within_its_budget_keeps_the_reserve_from_one_past_it(clock: Clock) -> None:
    s = make(clock, dsp_slots=2, realtime_reserve=1, per_client_running=9)
    hog = s.open_account("hog", REALTIME, VAD_BUDGET, owner=1)
    vad = s.open_account("vad", REALTIME, VAD_BUDGET, owner=2)
    first = job(s, hog)
    assert s.submit(first) is Outcome.RUN  # within its budget: realtime
    second = job(s, hog)
    # Its first call still runs: counted at its budget (never measured), it is past it.
    assert s.submit(second) is Outcome.QUEUED  # one call at a time while past its budget
    assert second.over_budget
    due = job(s, vad)
    assert s.submit(due) is Outcome.RUN  # the client within its budget finds the reserve
    assert due.klass == REALTIME


def test_an_over_budget_realtime_user_leaves_slots_for_a_normal_call(clock: Clock) -> None:
    """Issue 27: a realtime-group user with 2 connections x 2 calls of 12 s kept a normal
    user's call waiting 10.56 s. Past its budget each connection runs one call at a time,
    so a normal call arriving later finds a slot at once."""
    s = make(clock, realtime_utilisation_per_owner=0.25)
    connections = [s.open_account(f"rt{n}", REALTIME, VAD_BUDGET, owner=1000) for n in range(2)]
    calls = [job(s, account) for account in connections for _ in range(2)]
    outcomes = [s.submit(call) for call in calls]
    assert outcomes == [Outcome.RUN, Outcome.QUEUED, Outcome.RUN, Outcome.QUEUED]
    clock.now += 1.44
    victim = job(s, s.open_account("victim", NORMAL, owner=2000))
    assert s.submit(victim) is Outcome.RUN
    assert victim.dispatched == clock.now


# --- budgets under arrival jitter (issue 28): a leaky bucket, not a grid of periods ----------


def test_arrival_jitter_does_not_put_a_client_within_its_budget_past_it(clock: Clock) -> None:
    """A VAD within its 4 ms / 32 ms budget on average: one call came 6 ms late and took
    5 ms, the next 6 ms early. On a grid of periods anchored at its first call both fell
    in one period (5 ms used: the second ran as normal); counted as a bucket draining at
    the budget's rate, the early call finds 3.1 ms used and keeps realtime."""
    s = make(clock)
    vad = s.open_account("vad", REALTIME, VAD_BUDGET)
    start = clock.now
    for arrival, took in ((0.0, 0.003), (0.038, 0.005)):
        clock.now = start + arrival
        call = job(s, vad)
        assert s.submit(call) is Outcome.RUN
        assert call.klass == REALTIME
        clock.now += took
        s.finish(call, took)
    clock.now = start + 0.058  # 6 ms early: 15 ms after the slow call ended
    early = job(s, vad)
    s.submit(early)
    assert (early.klass, early.over_budget) == (REALTIME, False)
    assert vad.overruns == 1  # the 5 ms call itself used more than a budget


def test_a_client_steadily_over_its_budget_still_runs_as_normal_past_it(clock: Clock) -> None:
    """The other side: 7 ms every 32 ms (1.75 budgets) fills the bucket, and the call that
    finds a budget or more still there runs as normal, whatever the grid."""
    s = make(clock)
    vad = s.open_account("vad", REALTIME, VAD_BUDGET)
    start = clock.now
    classes = []
    for index in range(3):
        clock.now = start + index * VAD_BUDGET.period
        call = job(s, vad)
        s.submit(call)
        classes.append(call.klass)
        clock.now += 0.007
        s.finish(call, 0.007)
    # 7 ms, drained to 3.75 at the second call (realtime), 9.875 at its end, drained to
    # 6.625 at the third call: a budget or more is used, it runs as normal.
    assert classes == [REALTIME, REALTIME, NORMAL]
    # An overrun is a stretch past the budget: the first call's, then the second's (it
    # had drained below in between); the third adds to the second's.
    assert vad.overruns == 2

"""dspqueue work on the DSP's shared compute (issue 28, item 1): a DSP process's own
packet handling joins the same model as the calls of every process, through its
outstanding ``wait_signal``, in both PD isolations; with the model off (the default)
nothing is charged, as before. No timing is asserted: a piece of work is seen on the
driver's side while it runs, and the model's own busy count says what was charged."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from npud.fastrpc.host.dspqueue_cpu import GUARD, CpuQueues
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import EmulatedDriver, SimConfig
from npud.sim.compute import Job, SharedCompute
from tests.emulator import queue_echo_skel
from tests.emulator.test_sim_dspqueue import Echo, finish, library
from tests.polling import wait_until


def _driver(isolation: str, units: int, hmx: int = 0) -> EmulatedDriver:
    assert isolation in ("process", "thread")
    config = SimConfig(
        skels=queue_echo_skel.ECHO_SKELS,
        pd_isolation="process" if isolation == "process" else "thread",
        dsp_units=units,
        hmx_units=hmx,
    )
    return EmulatedDriver(config)


def _compute(driver: EmulatedDriver) -> SharedCompute:
    channel = driver._channel
    assert channel is not None
    return channel.compute


@pytest.fixture(params=["process", "thread"])
def isolation(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _session(driver: EmulatedDriver, tmp_path: Path) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=(library(tmp_path),))
    session.load_shell(DEV_SHELL.read_bytes())
    return session


@contextmanager
def _opened(
    isolation: str, tmp_path: Path, units: int, hmx: int = 0
) -> Iterator[tuple[EmulatedDriver, FastRpcSession]]:
    """A driver of ``units`` HVX and ``hmx`` HMX units and a session with its DSP process,
    both ended however the block ends."""
    driver = _driver(isolation, units, hmx)
    try:
        session = _session(driver, tmp_path)
        try:
            yield driver, session
        finally:
            session.end_process()
            session.close()
    finally:
        driver.shutdown()


@pytest.fixture
def modelled(isolation: str, tmp_path: Path) -> Iterator[tuple[EmulatedDriver, FastRpcSession]]:
    with _opened(isolation, tmp_path, 1, 1) as opened:
        yield opened


def test_a_packet_being_handled_is_work_on_the_channels_shared_compute(
    modelled: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = modelled
    compute = _compute(driver)
    queues = CpuQueues(session)
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    answered = threading.Event()

    def exchange() -> None:
        queue.write((), b"work:200000")  # 0.2 s of host CPU work in the handler
        assert queue.read().message == b"work:200000"
        answered.set()

    writer = threading.Thread(target=exchange)
    writer.start()
    # The piece joins the driver's model while the DSP process's thread handles it.
    wait_until(
        lambda: compute.active == 1 or answered.is_set(), "the piece never joined", timeout=GUARD
    )
    assert compute.active == 1
    assert not answered.is_set()
    writer.join(GUARD)
    assert answered.is_set()
    assert compute.active == 0
    assert compute.busy_seconds > 0.15
    finish(queues, echo, queue)


@pytest.mark.parametrize("units", [0, 1])
def test_wait_signal_answers_with_the_dsp_time_of_the_packets_handled(
    isolation: str, units: int, tmp_path: Path
) -> None:
    """The DSP process tells, with each wait_signal answer, the time of the work it did
    for the packets answered (issue 28, item 5): what npud charges a batch, through the
    driver's report and the session's InvokeResult, as a device's kernel cannot. A piece
    of 0.2 s of CPU lasts at least that long, modelled or not."""
    with _opened(isolation, tmp_path, units) as (driver, session):
        queues = CpuQueues(session)
        queue = queues.create()
        echo = Echo(session)
        assert echo.start(queue.qid) == 0
        queue.write((), b"work:200000")
        assert queue.read().message == b"work:200000"
        wait_until(lambda: queues.reported > 0, "no DSP time was reported", timeout=GUARD)
        assert 0.2 <= queues.reported < GUARD
        assert driver.dsp_report() is None  # this thread's last INVOKE reported nothing
        finish(queues, echo, queue)


def test_without_the_model_packet_handling_is_not_charged(isolation: str, tmp_path: Path) -> None:
    with _opened(isolation, tmp_path, 0) as (driver, session):
        queues = CpuQueues(session)
        queue = queues.create()
        echo = Echo(session)
        assert echo.start(queue.qid) == 0
        for _ in range(3):
            queue.write((), b"work:20000")
            assert queue.read().message == b"work:20000"
        assert _compute(driver).busy_seconds == 0
        finish(queues, echo, queue)


def test_two_dsp_processes_share_one_model(isolation: str, tmp_path: Path) -> None:
    """Each DSP process's pieces go to the same channel: two handled at once are both
    seen there (one DSP for all DSP processes)."""
    driver = _driver(isolation, 1)
    sessions = []
    for n in range(2):
        (tmp_path / str(n)).mkdir()
        sessions.append(_session(driver, tmp_path / str(n)))
    compute = _compute(driver)
    try:
        setups = []
        for session in sessions:
            queues = CpuQueues(session)
            queue = queues.create()
            echo = Echo(session)
            assert echo.start(queue.qid) == 0
            setups.append((queues, queue, echo))
        seen = 0

        def exchange(index: int) -> None:
            _, queue, _ = setups[index]
            queue.write((), b"work:300000")
            assert queue.read().message == b"work:300000"

        threads = [threading.Thread(target=exchange, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + GUARD
        while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
            seen = max(seen, compute.active)
            time.sleep(0.002)
        for thread in threads:
            thread.join(GUARD)
        assert seen == 2
        for queues, queue, echo in setups:
            finish(queues, echo, queue)
    finally:
        for session in sessions:
            session.end_process()
            session.close()
        driver.shutdown()


def test_a_piece_reaches_the_model_with_the_time_it_started(
    modelled: tuple[EmulatedDriver, FastRpcSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, item 5: the model counts a DSP process's piece from when it started in
    that process, not from when its begin came through ``wait_signal``'s thread (that
    lag was owed again at the piece's end, on every op batch's critical path)."""
    _, session = modelled
    seen: list[tuple[float | None, float]] = []
    begin = SharedCompute.begin

    def recording(
        self: SharedCompute, *, matrix: bool = False, started: float | None = None
    ) -> Job:
        seen.append((started, time.monotonic()))
        return begin(self, matrix=matrix, started=started)

    monkeypatch.setattr(SharedCompute, "begin", recording)
    queues = CpuQueues(session)
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    before = time.monotonic()
    queue.write((), b"work:1000")
    assert queue.read().message == b"work:1000"
    pieces = [(started, told) for started, told in seen if started is not None]
    assert pieces, f"no piece came with its start: {seen}"
    for started, told in pieces:
        assert before <= started <= told
    finish(queues, echo, queue)


def test_a_piece_is_charged_the_cpu_time_it_took_not_the_wall_time(
    modelled: tuple[EmulatedDriver, FastRpcSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece whose thread the host kept off its CPUs for a while (here a sleep: on a
    loaded host, the other processes) is charged the CPU time it took: the host's
    waiting is not work the DSP did, and charging it made every piece beside it wait
    for it a second time in the model (issue 28)."""
    _, session = modelled
    charged: list[float] = []
    end = SharedCompute.end

    def recording(self: SharedCompute, job: Job, seconds: float, cancelled: object = None) -> None:
        charged.append(seconds)
        end(self, job, seconds, cancelled)  # type: ignore[arg-type]

    monkeypatch.setattr(SharedCompute, "end", recording)
    queues = CpuQueues(session)
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0

    def charge_of(message: bytes) -> float:
        # A piece that starts before the CPU side's next wait_signal is out runs
        # uncharged (the module docstring): send it again until one is charged.
        for _ in range(20):
            charged.clear()
            queue.write((), message)
            assert queue.read().message == message
            if charged:
                return charged[0]
        raise AssertionError(f"{message!r} was never charged")

    assert charge_of(b"wait:200000") < 0.05  # 0.2 s off the CPU: about 0 charged
    assert charge_of(b"work:50000") >= 0.05  # 50 ms of CPU
    finish(queues, echo, queue)

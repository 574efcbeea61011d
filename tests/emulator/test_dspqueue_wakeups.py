"""Who a dspqueue event wakes in the emulated DSP process, and what wait_signal tells
(issue 28, item 5).

A batch of llama.cpp crosses two thread hand-offs in the DSP process: the doorbell
(``signal``) wakes the queue's reader, and the response it writes wakes the CPU's
outstanding ``wait_signal``. With one condition for everything, every event woke
every waiting thread, and each needless wake-up took the GIL from the thread the
event was for. Each event now wakes only the waiters it concerns; these tests spy
on the service's conditions (no timing is asserted) and check that the behaviour
around them is unchanged. A ``wait_signal`` answer also tells the DSP time of the
work done for the packets it answers (on a clock the test moves). The DSP process
here is a :class:`PdServices` over plain buffers, without a driver.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from collections.abc import Iterator
from typing import Final

import pytest

from npu_protocol.aee import AEE
from npud.sim import dspqueue as dq
from npud.sim import skels_dspqueue
from npud.sim.pd_services import FdMemory, PdServices
from npud.sim.skels_dspqueue import DspQueueService, QueueClosedError, QueueEndpoint, Signal
from tests.polling import wait_until

GUARD: Final = 60.0
QUEUE_FD: Final = 10
STATE_FD: Final = 11
BLOCK_FD: Final = 12
REQUEST: Final = dq.RingLayout(256, 2560, 2816, 3072)
RESPONSE: Final = dq.RingLayout(3328, 6656, 9984, 10240)
QUEUE_SIZE: Final = 10496


class Spy(threading.Condition):
    """A condition that counts its ``notify_all`` calls."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


class Process:
    """One DSP process with a queue in slot 0 imported by its consumer."""

    def __init__(self) -> None:
        self.buffers = {
            QUEUE_FD: bytearray(QUEUE_SIZE),
            STATE_FD: bytearray(dq.PROCESS_STATE_SIZE),
            BLOCK_FD: bytearray(4096),
        }
        memory = self.buffers[QUEUE_FD]
        struct.pack_into("<I", memory, dq.VERSION_OFFSET, dq.CURRENT_VERSION)
        struct.pack_into("<I", memory, dq.FLAGS_OFFSET, dq.FLAG_WAIT_COUNTS)
        for offset, ring in ((dq.REQUEST_OFFSET, REQUEST), (dq.RESPONSE_OFFSET, RESPONSE)):
            dq.RING.pack_into(memory, offset, *dataclasses.astuple(ring))
        self.pd = PdServices(self._resolve, self._crash)
        self.service = DspQueueService(self.pd)
        assert self.service.init_process_state(STATE_FD, self) == 0
        code, qid = self.service.create_queue(0, QUEUE_FD, 0, self)
        assert code == 0
        self.endpoint: QueueEndpoint = self.service.import_queue(qid)
        view = memoryview(memory)
        self.request = dq.Ring(view, REQUEST)  # the CPU writes it
        self.response = dq.Ring(view, RESPONSE)  # the CPU reads it
        self.readers = self._spy("_readers")
        self.cpu = self._spy("_cpu")
        self.settled = self._spy("_settled")

    def _spy(self, name: str) -> Spy:
        spy = Spy(self.service._lock)
        setattr(self.service, name, spy)
        return spy

    def _resolve(self, fd: int) -> FdMemory | None:
        buffer = self.buffers.get(fd)
        if buffer is None:
            return None
        return FdMemory(fd, memoryview(buffer), 0, len(buffer), lambda: None)

    @staticmethod
    def _crash(text: str) -> None:
        raise AssertionError(f"the PD crashed: {text}")

    def cpu_writes(self, message: bytes = b"batch") -> None:
        buffer = dq.QueueBuffer(BLOCK_FD, 64, 0, 0)
        assert self.request.write(0, [buffer], message, 0)

    def close(self) -> None:
        self.endpoint.close()
        self.request.release()
        self.response.release()
        self.service.pd_ended()


@pytest.fixture
def process() -> Iterator[Process]:
    made = Process()
    yield made
    made.close()


def _started(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_a_doorbell_wakes_the_queues_reader_not_the_cpus_wait_signal(process: Process) -> None:
    read: list[dq.Packet] = []
    reader = _started(lambda: read.append(process.endpoint.read()))
    process.cpu_writes()
    process.service.signal()
    reader.join(GUARD)
    assert len(read) == 1
    assert read[0].message == b"batch"
    assert process.readers.notified == 1
    assert process.cpu.notified == 0  # an outstanding wait_signal sleeps on
    assert process.settled.notified == 0


def test_a_response_wakes_the_cpus_wait_signal_not_the_queues_readers(process: Process) -> None:
    signals: list[Signal] = []
    waiter = _started(lambda: signals.append(process.service.wait_signal()))
    assert process.endpoint.write([], b"answer")
    waiter.join(GUARD)
    assert signals == [(0, 0.0)]  # no work was done for it
    assert process.cpu.notified == 1
    assert process.readers.notified == 0
    packet = process.response.peek()
    assert packet is not None
    assert packet.message == b"answer"
    assert process.service._state is not None
    assert process.service._state.get(dq.RESP_PACKET_COUNT, 0) == 1


def test_a_cancel_reaches_the_wait_signal_alone(process: Process) -> None:
    signals: list[Signal] = []
    waiter = _started(lambda: signals.append(process.service.wait_signal()))
    process.service.cancel_wait_signal()
    waiter.join(GUARD)
    assert signals == [(-1, 0.0)]
    assert process.readers.notified == 0


class Meter:
    """A ComputeMeter that records what it is told (the driver's side of a carrier)."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, float]] = []

    def begin(self, matrix: bool, started: float | None = None) -> int:
        return 1

    def end(self, job: int, seconds: float) -> None:
        self.ended.append((job, seconds))


def test_a_piece_of_work_goes_to_the_carrier_and_back_to_its_thread_alone(
    process: Process,
) -> None:
    service = process.service
    meter = Meter()
    signals: list[Signal] = []
    carrier = _started(lambda: signals.append(service.wait_signal(meter)))
    with service._lock:
        assert service._settled.wait_for(lambda: service._carriers == 1, GUARD)
    charge = service.charge_begin(matrix=True)
    assert charge is not None
    service.charge_end(charge, 0.25)
    assert meter.ended == [(1, 0.25)]
    assert service.charged == 1
    readers_before = process.readers.notified
    service.cancel_wait_signal()
    carrier.join(GUARD)
    assert signals == [(-1, 0.0)]
    assert process.readers.notified == readers_before == 0  # no reader was woken for it


def test_a_reader_wakes_when_its_queue_is_destroyed_under_it(process: Process) -> None:
    errors: list[Exception] = []

    def read() -> None:
        try:
            process.endpoint.read()
        except QueueClosedError as exc:
            errors.append(exc)

    reader = _started(read)
    # Once the reader sleeps on its condition (threading.Condition's own list of
    # waiters): the queue's end must wake it.
    wait_until(lambda: len(process.readers._waiters) == 1, "the reader never waited")  # type: ignore[attr-defined]
    process.service.release_owner(process)  # the handle that made the queue closes
    reader.join(GUARD)
    assert len(errors) == 1
    assert "destroyed" in str(errors[0])


def test_a_header_whose_queue_count_changed_stops_the_queue(process: Process) -> None:
    process.cpu_writes()
    struct.pack_into("<I", process.buffers[QUEUE_FD], dq.QUEUE_COUNT_OFFSET, 7)
    with pytest.raises(QueueClosedError):
        process.endpoint.read_nowait()
    (error,) = struct.unpack_from("<i", process.buffers[QUEUE_FD], dq.ERROR_OFFSET)
    assert error & 0xFFFFFFFF == AEE.ERPC.dsp
    assert process.cpu.notified == 1  # the CPU is told


class Clock:
    """``time`` for the service: ``monotonic`` moves only when told; CPU time is real."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def thread_time() -> float:
        return 0.0


def test_wait_signal_tells_the_dsp_time_of_the_work_since_its_last_answer(
    process: Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(skels_dspqueue, "time", clock)
    service, endpoint = process.service, process.endpoint
    for seconds in (0.004, 0.0025):  # two batches answered by one signal
        with endpoint.computing(matrix=True):
            clock.now += seconds
        assert endpoint.write([], b"answer")
    first = service.wait_signal()
    assert first.value == 0
    assert first.dsp_seconds == pytest.approx(0.0065)
    with endpoint.computing():
        clock.now += 0.001
    assert endpoint.write([], b"answer")
    assert service.wait_signal() == pytest.approx((0, 0.001))  # only what came since
    assert service.uncharged == 3  # no wait_signal carried them: the model saw none

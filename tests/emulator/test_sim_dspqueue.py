"""dspqueue on the emulated DSP: the dspqueue_rpc skel (methods 2-8) and the DSP's side of
the rings, driven by a Python port of the CPU library (npud/fastrpc/host/dspqueue_cpu.py)
through a real FastRpcSession, with a DSP-side consumer that echoes every request
(tests/emulator/queue_echo_skel.py). Each test runs in both PD isolations.

Nothing waits for time: a blocking call returns when the DSP signals, and fails the
test only after a guard of a minute.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from npu_protocol import AEE, ErrorCode
from npud.fastrpc.host.dspqueue_cpu import (
    BUFFERS,
    GUARD,
    MESSAGE,
    USER_READY,
    Buffer,
    CpuQueue,
    CpuQueueError,
    CpuQueues,
    WouldBlockError,
)
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator import queue_echo_skel

UINT32_MAX: Final = 0xFFFFFFFF
_U64: Final = struct.Struct("<Q")
_U32: Final = struct.Struct("<I")


def library(tmp_path: Path) -> Path:
    directory = tmp_path / "dsp"
    directory.mkdir(exist_ok=True)
    for item in DSP_LIBRARY_DIR.iterdir():
        (directory / item.name).write_bytes(item.read_bytes())
    queue_echo_skel.write_descriptor(directory)
    return directory


@pytest.fixture(params=["process", "thread"])
def driver(request: pytest.FixtureRequest) -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver(SimConfig(skels=queue_echo_skel.ECHO_SKELS, pd_isolation=request.param))
    yield driver
    driver.shutdown()
    assert driver.statistics().pd_children == 0


@pytest.fixture
def session(driver: EmulatedDriver, tmp_path: Path) -> Iterator[FastRpcSession]:
    session = FastRpcSession.open(driver, library_path=(library(tmp_path),))
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    session.end_process()  # a signal thread may still be in wait_signal
    session.close()


@pytest.fixture
def queues(session: FastRpcSession) -> Iterator[CpuQueues]:
    queues = CpuQueues(session)
    yield queues
    if not queues.closed:  # the test failed half-way: end the PD under the threads
        session.end_process()
        queues.join_receiver()
        queues.abandon()


class Echo:
    """The DSP-side consumer, through its skel."""

    def __init__(self, session: FastRpcSession) -> None:
        self.session = session
        self.handle = session.remote_open(queue_echo_skel.URI)

    def start(self, qid: int) -> int:
        inputs = [Inline(_U64.pack(qid))]
        return self.session.invoke(self.handle, queue_echo_skel.SC_START, inputs, []).rc

    def stop(self) -> None:
        assert self.session.invoke(self.handle, queue_echo_skel.SC_STOP, [], []).rc == 0

    def served(self) -> int:
        result = self.session.invoke(self.handle, queue_echo_skel.SC_SERVED, [], [Capacity(4)])
        assert result.rc == 0
        return int(_U32.unpack(result.output(0))[0])


def finish(queues: CpuQueues, echo: Echo | None, *created: CpuQueue) -> None:
    """Stop the consumer, close the queues and the domain: what a clean CPU does."""
    if echo is not None:
        echo.stop()
    for queue in created:
        queue.close()
    queues.close()
    assert queues.error == 0


# -- creation ------------------------------------------------------------------------------


def test_create_answers_the_version_handshake(queues: CpuQueues) -> None:
    queue = queues.create()
    assert queue.first_create in (AEE.EUNSUPPORTED, AEE.EUNSUPPORTED.dsp)
    assert queue.qid != 0
    assert queues.is_imported(queue.qid) == 0
    # The DSP advertises that it may wait: the CPU signals after every write.
    assert queue.state(queue.req_read)[2] == 1
    second = queues.create(512, 512)
    assert second.qid != queue.qid
    finish(queues, None, queue, second)


def _raw_queue(queues: CpuQueues) -> tuple[CpuQueue, memoryview]:
    """A queue laid out by the CPU but not created on the DSP (headers to play with)."""
    queue = CpuQueue(queues, 5, 77, 1024, 1024)
    return queue, queue.memory


@pytest.mark.parametrize(
    ("version", "flags", "expected"),
    [
        (UINT32_MAX, 1, AEE.EUNSUPPORTED.dsp),
        (3, 1, AEE.EUNSUPPORTED.dsp),
        (0, 0, AEE.EUNSUPPORTED.dsp),
        (1, 1, AEE.EUNSUPPORTED.dsp),  # version 1 has no flags
        (2, 2, AEE.EUNSUPPORTED.dsp),  # driver signaling: not on this DSP
        (2, 4, AEE.EUNSUPPORTED.dsp),
        (2, 1, 0),
        (2, 0, 0),
        (1, 0, 0),
    ],
)
def test_create_checks_version_and_flags(
    queues: CpuQueues, version: int, flags: int, expected: int
) -> None:
    queue, _ = _raw_queue(queues)
    queue.write_header(version, flags)
    rc, qid = queues.create_queue_raw(queue.slot, queue.buffer.fd, queue.count)
    assert rc == expected
    if rc == 0:
        assert queues.destroy_queue_raw(qid) == 0
    queue.free()
    queues.close()


def test_create_refuses_what_it_cannot_serve(queues: CpuQueues) -> None:
    queue, memory = _raw_queue(queues)
    queue.write_header(2, 1)
    fd, count = queue.buffer.fd, queue.count
    assert queues.create_queue_raw(64, fd, count)[0] == AEE.EBADPARM.dsp  # no such slot
    assert queues.create_queue_raw(5, fd, count + 1)[0] == AEE.EBADPARM.dsp  # queue_count
    unmapped = queues.session.alloc(4096)
    assert queues.create_queue_raw(5, unmapped.fd, count)[0] == AEE.ENOSUCHMAP.dsp
    struct.pack_into("<I", memory, 16, 1 << 20)  # the request ring past the buffer
    assert queues.create_queue_raw(5, fd, count)[0] == AEE.EBADPARM.dsp
    struct.pack_into("<I", memory, 16, 1020)  # not a multiple of 8
    assert queues.create_queue_raw(5, fd, count)[0] == AEE.EBADPARM.dsp
    queue.write_header(2, 1)
    struct.pack_into("<I", memory, 20, queue.resp_offset)  # a state inside the other ring
    assert queues.create_queue_raw(5, fd, count)[0] == AEE.EBADPARM.dsp
    queue.write_header(2, 1)
    rc, qid = queues.create_queue_raw(5, fd, count)
    assert rc == 0
    assert queues.create_queue_raw(5, fd, count)[0] == AEE.EBADPARM.dsp  # slot in use
    assert queues.destroy_queue_raw(qid) == 0
    assert queues.destroy_queue_raw(qid) == AEE.EBADPARM.dsp
    assert queues.destroy_queue_raw(qid ^ 0x100) == AEE.EBADPARM.dsp
    queue.free()
    queues.session.free(unmapped)
    queues.close()


# -- packets --------------------------------------------------------------------------------


def test_an_imported_queue_cannot_be_destroyed_or_imported_twice(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    assert queues.is_imported(queue.qid) == 1
    assert queues.destroy_queue_raw(queue.qid) == AEE.EBADPARM.dsp
    assert Echo(session).start(queue.qid) == AEE.EITEMBUSY.dsp
    assert Echo(session).start(queue.qid + 0x100) == AEE.EBADPARM.dsp
    echo.stop()
    assert queues.is_imported(queue.qid) == 0
    finish(queues, None, queue)


def test_many_packets_wrap_both_rings(session: FastRpcSession, queues: CpuQueues) -> None:
    """Small rings and packets of every size up to half a ring: the writers on both sides
    wrap with the replica header, block for space and are woken by the other side's
    signals. (A packet larger than half the ring can block for good in an empty ring: a
    packet never straddles the end, so it needs the tail or the head free in one piece,
    and with both positions in the middle neither may be. dspqueue_cpu.c has the same
    property; the test keeps clear of it.)"""
    queue = queues.create(256, 256)
    data = queues.map(session.alloc(8192))
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    count = 400
    sent: list[tuple[tuple[Buffer, ...], bytes]] = []
    for index in range(count):
        message = bytes((index + j) & 0xFF for j in range(index % 61 + 1))
        buffers = tuple(Buffer(data.fd, 64, 64 * j) for j in range(index % 3))
        sent.append((buffers, message))

    def write_all() -> None:
        for buffers, message in sent:
            queue.write(buffers, message)

    writer = threading.Thread(target=write_all)
    writer.start()
    wraps_seen = 0
    for buffers, message in sent:
        read_before = queue.state(queue.resp_read)[0]
        packet = queue.read()
        if queue.state(queue.resp_read)[0] < read_before:
            wraps_seen += 1
        assert packet.message == message
        assert [(b.fd, b.size, b.offset) for b in packet.buffers] == [
            (b.fd, b.size, b.offset) for b in buffers
        ]
        assert packet.flags & USER_READY
        assert bool(packet.flags & BUFFERS) == bool(buffers)
        assert packet.flags & MESSAGE
    writer.join(GUARD)
    assert not writer.is_alive()
    assert wraps_seen > 10
    assert echo.served() == count
    assert queue.state(queue.req_read)[:2] == queue.state(queue.req_write)[:2]
    assert queue.state(queue.req_read)[1] == count
    assert queue.state(queue.resp_write)[1] == count
    assert queues.state_count(1, queue.slot) == count  # req_space_count, the DSP's
    assert queues.state_count(2, queue.slot) == count  # resp_packet_count, the DSP's
    finish(queues, echo, queue)
    session.free(data)


def test_a_packet_that_wraps_is_read_from_its_replica(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create(256, 256)
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    # 5 x 48 bytes leave the writer at 240: a 48-byte packet no longer fits before 256.
    for index in range(5):
        queue.write((), bytes([index]) * 40)
        assert queue.read().message == bytes([index]) * 40
    assert queue.state(queue.req_write)[0] == 240
    queue.write((), b"W" * 40)
    raw = struct.unpack_from("<Q", queue.memory, queue.req_offset + 240)[0]
    assert struct.unpack_from("<Q", queue.memory, queue.req_offset)[0] == raw  # the replica
    assert queue.read().message == b"W" * 40
    assert queue.state(queue.req_read)[0] == 48  # read from 8, after the replica
    assert queue.state(queue.resp_write)[0] == 48  # the DSP wrapped its response too
    finish(queues, echo, queue)


def test_a_full_queue_blocks_the_writer_until_the_dsp_reads(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create(512, 4096)
    written = 0
    while True:
        try:
            queue.write_noblock((), struct.pack("<I", written) * 8)
        except WouldBlockError:
            break
        written += 1
    assert written == (512 - 8) // 40  # 40-byte packets, 8 bytes always free
    last = threading.Thread(target=lambda: queue.write((), struct.pack("<I", written) * 8))
    last.start()
    assert queue.writer_waiting.wait(GUARD)
    assert queue.state(queue.req_write)[2] == 1  # the CPU's writer advertises its wait
    echo = Echo(session)
    assert echo.start(queue.qid) == 0  # the DSP reads: space, and a signal for it
    for index in range(written + 1):
        assert queue.read().message == struct.pack("<I", index) * 8
    last.join(GUARD)
    assert not last.is_alive()
    finish(queues, echo, queue)


def test_a_full_response_ring_blocks_the_dsp_until_the_cpu_reads(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create(4096, 256)
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    fits = (256 - 8) // 48
    for index in range(3 * fits):
        queue.write((), bytes([index]) * 40)
    queues.wait_until(
        lambda: queue.state(queue.resp_write)[1] >= fits, "the DSP filling the response ring"
    )
    for index in range(3 * fits):
        assert queue.read().message == bytes([index]) * 40
    assert echo.served() == 3 * fits
    finish(queues, echo, queue)


def test_a_packet_with_64_buffers(session: FastRpcSession, queues: CpuQueues) -> None:
    queue = queues.create(4096, 4096)
    buffers = [queues.map(session.alloc(8192)) for _ in range(4)]
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    refs = [
        Buffer(buffers[i % 4].fd, 16 * (i % 7 + 1), 64 * i, 0x90)
        if i % 5
        else Buffer(buffers[i % 4].fd, 0, 0, 0x90)  # size 0: the whole buffer
        for i in range(64)
    ]
    queue.write(refs, b"sixty-four")
    packet = queue.read()
    assert packet.message == b"sixty-four"
    assert len(packet.buffers) == 64
    by_fd = {buffer.fd: buffer for buffer in buffers}
    for sent, got in zip(refs, packet.buffers, strict=True):
        owner = by_fd[sent.fd]
        assert (got.fd, got.offset, got.flags) == (sent.fd, sent.offset, 0x90)
        assert got.size == (sent.size or owner.size)  # the reader fills a size of 0
        assert got.ptr == owner.host_address + sent.offset  # the CPU's own address
    with pytest.raises(CpuQueueError) as refused:
        queue.write([*refs, refs[0]], b"")
    assert refused.value.code == AEE.EBADPARM
    finish(queues, echo, queue)
    for buffer in buffers:
        queues.unmap(buffer)
        session.free(buffer)


# -- packets the DSP refuses ---------------------------------------------------------------


def _refused(queues: CpuQueues, echo: Echo, queue: CpuQueue, code: int) -> None:
    queues.wait_until(lambda: queue.error != 0, "the DSP refusing the packet")
    assert queue.error & 0xFFFFFFFF == code
    assert queue.state(queue.req_read)[:2] == (0, 0)  # not consumed
    assert echo.served() == 0
    assert queues.is_imported(queue.qid) == 1  # the import stays until its owner closes it
    finish(queues, echo, queue)


def test_a_packet_without_user_ready_is_refused(session: FastRpcSession, queues: CpuQueues) -> None:
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    queue.write_raw(16 | MESSAGE << 32, b"notready")
    _refused(queues, echo, queue, AEE.EBADITEM.dsp)


def test_a_packet_naming_an_unknown_fd_is_refused(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create()
    stranger = session.alloc(4096)  # never mapped into the DSP process
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    reference = struct.pack("<IIIIQ", stranger.fd, 0, 0, 0, 0)
    queue.write_raw(32 | (BUFFERS | USER_READY) << 32 | 1 << 48, reference)
    _refused(queues, echo, queue, AEE.ENOSUCHMAP.dsp)
    session.free(stranger)


def test_a_buffer_past_its_mapping_is_refused(session: FastRpcSession, queues: CpuQueues) -> None:
    queue = queues.create()
    data = queues.map(session.alloc(4096))
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    reference = struct.pack("<IIIIQ", data.fd, 4096, 8, 0, 0)
    queue.write_raw(32 | (BUFFERS | USER_READY) << 32 | 1 << 48, reference)
    _refused(queues, echo, queue, AEE.EBADITEM.dsp)
    queues.unmap(data)
    session.free(data)


def test_a_header_longer_than_the_data_is_refused(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create()
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    queue.write_raw(400 | (MESSAGE | USER_READY) << 32, b"short")
    _refused(queues, echo, queue, AEE.EBADITEM.dsp)


# -- signals ------------------------------------------------------------------------------------


def test_wait_signal_returns_minus_one_after_cancel(queues: CpuQueues) -> None:
    queue = queues.create()
    queue.close()
    queues.close()  # cancel_wait_signal: the receive thread's wait_signal returns -1
    assert queues.error == 0


def test_a_packet_written_before_the_import_is_served(
    session: FastRpcSession, queues: CpuQueues
) -> None:
    queue = queues.create()
    queue.write((), b"early")
    echo = Echo(session)
    assert echo.start(queue.qid) == 0
    assert queue.read().message == b"early"
    finish(queues, echo, queue)


def test_the_process_state_is_per_pd(driver: EmulatedDriver, tmp_path: Path) -> None:
    """Two PDs each have queue slot 0 and signals of their own."""
    sessions = []
    for _ in range(2):
        session = FastRpcSession.open(driver, library_path=(library(tmp_path),))
        session.load_shell(DEV_SHELL.read_bytes())
        sessions.append(session)
    domains = [CpuQueues(session) for session in sessions]
    made = [domain.create() for domain in domains]
    echoes = [Echo(session) for session in sessions]
    assert [queue.slot for queue in made] == [0, 0]
    for echo, queue in zip(echoes, made, strict=True):
        assert echo.start(queue.qid) == 0
    for index, queue in enumerate(made):
        queue.write((), bytes([index]) * 8)
    for index, queue in enumerate(made):
        assert queue.read().message == bytes([index]) * 8
    for domain, echo, queue in zip(domains, echoes, made, strict=True):
        finish(domain, echo, queue)
    for session in sessions:
        session.close()


def test_a_thread_of_the_pd_that_raises_crashes_the_pd(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    echo = Echo(session)
    crashes = driver.statistics().pd_crashes
    try:  # thread isolation: the call itself may end first, or the PD's end reaches it
        rc = session.invoke(echo.handle, queue_echo_skel.SC_CRASH_THREAD, [], []).rc
        code = None
    except RpcError as crashed:
        rc, code = None, crashed.code
    assert (rc, code) in ((0, None), (None, ErrorCode.DSP_RESTARTED))
    with pytest.raises(RpcError) as ended:  # the session saw its DSP process end
        session.invoke(echo.handle, queue_echo_skel.SC_SERVED, [], [Capacity(4)])
    assert ended.value.code is ErrorCode.DSP_RESTARTED
    assert driver.statistics().pd_crashes == crashes + 1
    assert not [t for t in threading.enumerate() if t.name == "dsp-boom"]

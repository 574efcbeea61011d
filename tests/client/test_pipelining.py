"""Several threads on one blocking client: pipelined, answered out of order, bounded."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable

import pytest

import npu_client
import npu_protocol as p
from tests.client.conftest import open_fds
from tests.client.peer import ECHO_URI, Hold, HoldThenReverse, Peer
from tests.polling import wait_until

THREADS = 8


def _run_threads(count: int, body: Callable[[int], None], peer: Peer) -> list[BaseException]:
    """Run ``body(i)`` on ``count`` threads; returns what they raised. If they do not
    finish (a client that serialized its callers never lets the peer answer), the
    peer hangs up so the test fails instead of hanging."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            body(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if any(thread.is_alive() for thread in threads):
        for conn in peer.connections:
            conn.hang_up()
        for thread in threads:
            thread.join(timeout=30)
        pytest.fail("the threads did not all get their answers")
    return errors


def test_threads_pipeline_and_each_gets_its_own_answer(
    client: npu_client.Client, peer: Peer
) -> None:
    holder = HoldThenReverse(THREADS)
    peer.intercept = holder
    results: dict[int, bytes] = {}

    def ping(index: int) -> None:
        results[index] = client.ping(f"thread-{index}".encode())

    assert _run_threads(THREADS, ping, peer) == []
    assert holder.most_held == THREADS  # all in flight at once
    assert results == {i: f"thread-{i}".encode() for i in range(THREADS)}
    sent = [r.id for r in peer.connection().requests]
    assert holder.answered == sent[::-1]  # answered last first


def test_allocs_answered_out_of_order_hand_each_fd_to_its_caller(
    client: npu_client.Client, peer: Peer
) -> None:
    before = open_fds()
    holder = HoldThenReverse(THREADS, kinds=(p.AllocRequest,))
    peer.intercept = holder
    buffers: dict[int, npu_client.DmaBuffer] = {}

    def alloc(index: int) -> None:
        buffer = client.alloc(4096 * (index + 1))
        buffer.view()[:8] = index.to_bytes(8, "little")
        buffers[index] = buffer

    assert _run_threads(THREADS, alloc, peer) == []
    assert holder.most_held == THREADS
    conn = peer.connection()
    for index, buffer in buffers.items():
        assert buffer.size == 4096 * (index + 1)
        # The fd this caller got is the very memfd the peer made for its buffer id.
        assert conn.buffers[buffer.id].memory[:8] == index.to_bytes(8, "little")
        assert os.fstat(buffer.fd).st_size == buffer.size
    for buffer in buffers.values():
        buffer.free()
    assert open_fds() == before


def test_mixed_requests_from_threads(client: npu_client.Client, peer: Peer) -> None:
    holder = HoldThenReverse(
        4, kinds=(p.AllocRequest, p.StatusRequest, p.PingRequest, p.OpenRequest)
    )
    peer.intercept = holder
    seen: dict[str, object] = {}

    def work(index: int) -> None:
        if index == 0:
            with client.alloc(100) as buffer:
                seen["alloc"] = (buffer.id, buffer.size)
        elif index == 1:
            seen["status"] = client.status().daemon_version
        elif index == 2:
            seen["ping"] = client.ping(b"p")
        else:
            seen["open"] = client.open(ECHO_URI).id

    assert _run_threads(4, work, peer) == []
    assert holder.most_held == 4
    assert seen["alloc"] in {(1, 4096), (2, 4096)}
    assert {seen["alloc"][0], seen["open"]} == {1, 2}  # the peer numbers both from one counter
    assert seen["status"] == "0.1.0-peer"
    assert seen["ping"] == b"p"


def test_requests_beyond_the_in_flight_limit_wait_for_a_free_slot(socket_path: str) -> None:
    limit = 2
    with Peer(
        socket_path, limits=p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=limit)
    ) as peer:
        holder = HoldThenReverse(limit)
        peer.intercept = holder
        with npu_client.connect(peer.path, name="bounded") as client:
            results: list[bytes] = []
            assert _run_threads(6, lambda i: results.append(client.ping(bytes([i]))), peer) == []
            assert sorted(results) == [bytes([i]) for i in range(6)]
            # The peer's ServerConnection refuses a third request in flight (fatal),
            # so reaching here means the client never sent one.
            assert holder.most_held == limit


def test_a_client_timeout_abandons_the_answer_and_closes_its_fd(peer: Peer) -> None:
    before = open_fds()
    hold = Hold(p.AllocRequest)
    peer.intercept = hold
    with npu_client.connect(peer.path, name="impatient", timeout=0.2) as client:
        with pytest.raises(TimeoutError, match="npud did not answer in time"):
            client.alloc(4096)
        hold.wait_held()
        peer.intercept = None
        hold.release()  # the late answer, with its fd
        assert client.ping(b"after") == b"after"  # reads and drops the late alloc reply
        assert client.buffers == ()
        assert client.statistics().requests_in_flight == 0
    peer.wait_closed()
    assert open_fds() == before


def test_a_waiting_thread_times_out_while_another_reads(peer: Peer) -> None:
    hold = Hold(p.StatusRequest)
    peer.intercept = hold
    with npu_client.connect(peer.path, name="two", timeout=0.3) as client:
        outcome: list[BaseException | bytes] = []

        def slow() -> None:
            try:
                client.status()
            except TimeoutError as exc:
                outcome.append(exc)

        reader = threading.Thread(target=slow)
        reader.start()
        hold.wait_held()
        with pytest.raises(TimeoutError):
            client.status()
        reader.join(timeout=30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], TimeoutError)
        hold.release()
        assert client.ping() == b""


def test_when_the_reader_is_answered_first_a_waiting_thread_reads_on(
    client: npu_client.Client, peer: Peer
) -> None:
    # The first caller reads; three more wait. Answered in the order they were
    # sent, one at a time, each answer ends the wait of the thread that reads
    # while others still wait, so reading must pass to one of them every time.
    # A client that does not hand reading over leaves them waiting for ever.
    hold = Hold(p.PingRequest)
    peer.intercept = hold
    done = threading.Semaphore(0)
    results: dict[int, bytes] = {}

    def ping(index: int) -> None:
        results[index] = client.ping(bytes([index]))
        done.release()

    threads = [threading.Thread(target=ping, args=(i,)) for i in range(4)]
    threads[0].start()
    hold.wait_held()
    # the first caller is the one reading
    wait_until(lambda: client._reading, "a reader", timeout=30)
    for thread in threads[1:]:
        thread.start()
    hold.wait_held(3)
    held, hold.held = hold.held, []
    for answered, (conn, request) in enumerate(held):
        conn.send(conn.serve(request))
        if not done.acquire(timeout=30):
            for connection in peer.connections:
                connection.hang_up()
            pytest.fail(f"{answered} of 4 callers got their answer, then reading stopped")
    for thread in threads:
        thread.join(timeout=30)
    assert results == {i: bytes([i]) for i in range(4)}


def test_close_fails_the_callers_that_wait_and_returns(peer: Peer) -> None:
    before = open_fds()
    hold = Hold(p.StatusRequest)
    peer.intercept = hold
    client = npu_client.connect(peer.path, name="closing")
    errors: list[BaseException] = []

    def status() -> None:
        try:
            client.status()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=status) for _ in range(3)]  # one reads, two are parked
    for thread in threads:
        thread.start()
    hold.wait_held(3)
    client.close()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert [type(error) for error in errors] == [npu_client.ConnectionClosedError] * 3
    assert {str(error) for error in errors} == {"the connection is closed: this client was closed"}
    peer.wait_closed()
    assert open_fds() == before


def test_answers_larger_than_the_receive_buffer_arrive_whole(
    client: npu_client.Client,
) -> None:
    data = os.urandom(300_000)  # several reads of the client's 64 KiB buffer
    with client.open(ECHO_URI) as echo:
        for size in (65_536 - 100, 65_536, 300_000):
            [out] = echo.invoke(2, [struct.pack("<II", size, size), data[:size]], [size])
            assert out == data[:size]


def test_a_call_that_timed_out_before_its_request_went_out_frees_its_slot(
    socket_path: str,
) -> None:
    # A request framed but never written is never answered: kept in flight, it held
    # one of the daemon's max_in_flight slots for ever, and once they were all taken
    # every call of the connection waited for a slot while npud sat idle.
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=1)
    with (
        Peer(socket_path, limits=limits) as peer,
        npu_client.connect(peer.path, name="withdrawn", timeout=0.2) as client,
    ):
        # Another thread's request holds the socket.
        with client._send_lock, pytest.raises(TimeoutError, match="did not take our request"):
            client.status()
        assert client.statistics().requests_in_flight == 0
        assert client.ping(b"after") == b"after"  # the one slot is free again
        assert [type(r) for r in peer.connection().requests] == [p.PingRequest]


def test_threads_whose_requests_never_went_out_leave_no_slot_taken(socket_path: str) -> None:
    # Every thread gives up before its request is written; then each slot is used again.
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=2)
    with (
        Peer(socket_path, limits=limits) as peer,
        npu_client.connect(peer.path, name="withdrawn", timeout=0.2) as client,
    ):

        def ping(index: int) -> None:
            client.ping(bytes([index]))

        with client._send_lock:
            errors = _run_threads(THREADS, ping, peer)
        assert [type(error) for error in errors] == [TimeoutError] * THREADS
        assert client.statistics().requests_in_flight == 0
        results: list[bytes] = []
        assert _run_threads(THREADS, lambda i: results.append(client.ping(bytes([i]))), peer) == []
        assert sorted(results) == [bytes([i]) for i in range(THREADS)]

"""Server events, refusals, a server that goes away or misbehaves, and connecting."""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading

import pytest

import npu_client
import npu_protocol as p
from npu_client.transport import send_message
from tests.client.conftest import open_fds
from tests.client.peer import (
    ECHO_URI,
    HANDLED,
    Hold,
    Peer,
    PeerConnection,
    raw_frame,
    serve_once,
)


def test_a_session_restart_keeps_buffers_unmapped_and_ends_handles(peer: Peer) -> None:
    """Version 3: a buffer belongs to no DSP process; only its mapping goes."""
    events: list[p.ServerEvent] = []
    with npu_client.connect(peer.path, name="restart", on_event=events.append) as client:
        buffer = client.alloc(4096)
        buffer.map()
        buffer.view()[:5] = b"still"
        handle = client.open(ECHO_URI)
        restarted = p.SessionRestarted(epoch=2, reason="SSR", domain="default")
        peer.broadcast(restarted)
        assert client.ping() == b""
        assert client.epoch == 2
        assert events == [restarted]
        assert not buffer.freed
        assert client.buffers == (buffer,)
        assert buffer.dsp_address is None  # its mapping died with the DSP process
        assert bytes(buffer.view()[:5]) == b"still"
        with pytest.raises(npu_client.DspRestarted, match="reopen the session"):
            handle.invoke(2, [struct.pack("<II", 0, 0), b""], [0])
        handle.close()  # gone with the session: no error
        assert buffer.map() is not None  # mapped again, in the new process
        buffer.free()
        assert buffer.freed


def test_a_version_2_session_restart_moves_the_epoch_and_releases_old_buffers(
    peer: Peer,
) -> None:
    peer.protocol_version = 2
    events: list[p.ServerEvent] = []
    before = open_fds()
    with npu_client.connect(peer.path, name="restart", on_event=events.append) as client:
        buffer = client.alloc(4096)
        buffer.map()
        view = buffer.view()
        handle = client.open(ECHO_URI)
        peer.broadcast(p.SessionRestarted(epoch=2, reason="SSR"))
        assert client.epoch == 1  # nothing read yet
        assert client.ping() == b""
        assert client.epoch == 2
        assert events == [p.SessionRestarted(epoch=2, reason="SSR")]
        assert buffer.freed
        assert client.buffers == ()
        with pytest.raises(ValueError, match=r"buffer 1 is gone: the DSP restarted \(session"):
            buffer.slice()
        view.release()
        with pytest.raises(npu_client.DspRestarted, match="reopen the session"):
            handle.invoke(2, [struct.pack("<II", 0, 0), b""], [0])
        handle.close()  # gone with the session: no error
        assert handle.closed
        buffer.free()  # already released: nothing to do
        fresh = client.alloc(4096)
        assert fresh.epoch == 2
        assert fresh.id > buffer.id
    peer.wait_closed()
    assert open_fds() == before


def test_an_alloc_answered_before_the_restart_event_is_gone_with_version_2(
    peer: Peer,
) -> None:
    peer.protocol_version = 2
    hold = Hold(p.AllocRequest)
    peer.intercept = hold
    with npu_client.connect(peer.path, name="racy") as client:
        outcome: list[BaseException] = []

        def alloc() -> None:
            try:
                client.alloc(4096)
            except npu_client.DspRestarted as exc:
                outcome.append(exc)

        thread = threading.Thread(target=alloc)
        thread.start()
        hold.wait_held()
        conn = peer.connection()
        [(_, request)] = hold.held
        hold.held.clear()
        # The reply and the restart event arrive in one read: the buffer belonged
        # to the session that ended.
        conn.send_together(conn.serve(request), p.SessionRestarted(epoch=2))
        conn.forget_everything()
        thread.join(timeout=30)
        assert len(outcome) == 1
        assert client.buffers == ()
        assert client.epoch == 2


def test_shutting_down_is_recorded_and_requests_fail_with_the_servers_error(peer: Peer) -> None:
    seen: list[p.ServerEvent] = []
    with npu_client.connect(peer.path, name="stopping", on_event=seen.append) as client:
        peer.broadcast(p.ShuttingDown(reason="systemctl stop", grace_ms=5000))

        def refuse(conn: PeerConnection, request: p.AnyRequest) -> object:
            if isinstance(request, p.PingRequest) and request.payload == b"last":
                conn.send(p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN, id=request.id))
                conn.send(p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN))
                conn.hang_up()
                return HANDLED
            return p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN, id=request.id)

        peer.intercept = refuse
        with pytest.raises(npu_client.ShuttingDownError, match="npud is shutting down"):
            client.status()
        assert client.shutting_down
        assert client.shutdown_notice == p.ShuttingDown(reason="systemctl stop", grace_ms=5000)
        assert seen == [client.shutdown_notice]
        with pytest.raises(npu_client.ShuttingDownError):
            client.ping(b"last")
        # The server said why it closed: later requests fail with that, without sending.
        with pytest.raises(npu_client.ShuttingDownError):
            client.ping()
        assert client.statistics().closed


def test_a_failing_callback_is_logged_and_the_request_succeeds(
    peer: Peer, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(event: p.ServerEvent) -> None:
        raise RuntimeError("callback bug")

    with npu_client.connect(peer.path, name="cb", on_event=explode) as client:
        peer.broadcast(p.SessionRestarted(epoch=5))
        with caplog.at_level(logging.ERROR, logger="npu_client"):
            assert client.ping(b"x") == b"x"
        assert client.epoch == 5
    [record] = caplog.records
    assert "on_event callback failed" in record.getMessage()
    assert record.exc_info is not None


def test_the_callback_may_use_the_client(peer: Peer) -> None:
    answers: list[bytes] = []
    with npu_client.connect(peer.path, name="cb") as client:

        def on_event(event: p.ServerEvent) -> None:
            answers.append(client.ping(b"from the callback"))

        client._on_event = on_event
        peer.broadcast(p.SessionRestarted(epoch=2))
        assert client.ping(b"outer") == b"outer"
    assert answers == [b"from the callback"]


def test_a_server_that_closes_mid_request_fails_every_waiter(peer: Peer) -> None:
    before = open_fds()
    hold = Hold(p.StatusRequest)

    def hang_up_on_invoke(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.InvokeRequest):
            conn.hang_up()
            return HANDLED
        return hold(conn, request)

    peer.intercept = hang_up_on_invoke
    client = npu_client.connect(peer.path, name="abandoned")
    buffer = client.alloc(4096)
    errors: list[BaseException] = []

    def status() -> None:
        try:
            client.status()
        except npu_client.ConnectionClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=status)
    waiter.start()
    hold.wait_held()
    with client.open(ECHO_URI) as echo, pytest.raises(npu_client.ConnectionClosedError) as caught:
        echo.invoke(2, [struct.pack("<II", 1, 1), buffer.slice(0, 1)], [1])
    assert caught.value.message == "the connection is closed: npud closed the connection"
    waiter.join(timeout=30)
    assert len(errors) == 1
    with pytest.raises(npu_client.ConnectionClosedError):
        client.ping()
    client.close()
    assert buffer.freed
    peer.wait_closed()
    assert open_fds() == before


def test_a_refused_hello_raises_the_servers_error(peer: Peer) -> None:
    before = open_fds()
    peer.refusal = p.ErrorMessage.for_code(
        p.ErrorCode.NOT_PERMITTED, detail="uid 1001 may not use the NPU"
    )
    with pytest.raises(npu_client.NotPermitted) as caught:
        npu_client.connect(peer.path, name="stranger")
    assert caught.value.message == "not permitted: uid 1001 may not use the NPU"
    assert caught.value.fields == {"detail": "uid 1001 may not use the NPU"}
    peer.wait_closed()
    assert open_fds() == before


def test_a_server_that_closes_during_the_handshake(socket_path: str) -> None:
    thread = serve_once(socket_path, b"")
    with pytest.raises(
        npu_client.ConnectionClosedError, match="closed the connection during the handshake"
    ):
        npu_client.connect(socket_path, name="early")
    thread.join(timeout=30)


def test_a_server_that_breaks_the_protocol(socket_path: str) -> None:
    thread = serve_once(socket_path, b"XX\x00\x00\x05\x00\x00\x00hello")
    with pytest.raises(
        npu_client.BadFrameHeader, match="npud broke the protocol: bad frame header"
    ):
        npu_client.connect(socket_path, name="garbage")
    thread.join(timeout=30)


def test_a_refusal_before_the_hello_is_read_still_names_its_reason(socket_path: str) -> None:
    # The daemon may refuse a peer as it accepts it (SO_PEERCRED) and close with
    # our Hello unread: the close then resets the connection. The refusal that
    # came first is what the caller hears.
    refusal = p.ErrorMessage.for_code(p.ErrorCode.NOT_PERMITTED, detail="uid 65534 is not allowed")
    thread = serve_once(socket_path, raw_frame(refusal), read_hello=False)
    with pytest.raises(npu_client.NotPermitted, match="not permitted: uid 65534 is not allowed"):
        npu_client.connect(socket_path, name="stranger")
    thread.join(timeout=30)


def test_an_answer_to_an_unknown_request_is_a_protocol_error(peer: Peer) -> None:
    def stray(conn: PeerConnection, request: p.AnyRequest) -> object:
        conn.sock.sendall(raw_frame(p.PongReply(id=request.id + 1000)))
        return HANDLED

    peer.intercept = stray
    with npu_client.connect(peer.path, name="confused") as client:
        with pytest.raises(npu_client.UnknownRequestId, match="not in flight"):
            client.ping()
        with pytest.raises(npu_client.UnknownRequestId):
            client.ping()


def test_connect_names_the_path_and_what_to_do(socket_path: str) -> None:
    with pytest.raises(npu_client.ConnectFailed) as caught:
        npu_client.connect(socket_path)
    error = caught.value
    assert error.path == socket_path
    assert error.message == (
        f"cannot connect to npud at {socket_path}: No such file or directory; "
        "is npud running, and is that path its socket?"
    )
    assert isinstance(error.__cause__, FileNotFoundError)


def test_connect_to_a_socket_nobody_listens_on(socket_path: str) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(socket_path)
    stale.close()
    with pytest.raises(npu_client.ConnectFailed, match="Connection refused; is npud running"):
        npu_client.connect(socket_path)


def test_the_environment_names_the_default_socket(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPUD_SOCKET", peer.path)
    with npu_client.connect(name="from-env") as client:
        assert client.path == peer.path
        assert client.ping(b"env") == b"env"


def test_a_request_to_a_daemon_that_already_left_fails_with_its_reason(peer: Peer) -> None:
    with npu_client.connect(peer.path, name="late") as client:
        conn = peer.connection()
        conn.send(p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN))
        conn.hang_up()
        assert conn.closed.wait(timeout=30)
        # Sending finds a broken pipe; the reason the daemon gave is what we report.
        with pytest.raises(npu_client.ShuttingDownError, match="npud is shutting down"):
            client.ping()
        with pytest.raises(npu_client.ShuttingDownError):
            client.alloc(4096)


def test_surplus_fds_from_the_daemon_are_closed(peer: Peer) -> None:
    sent = threading.Event()

    def with_stray_fd(conn: PeerConnection, request: p.AnyRequest) -> object:
        if not isinstance(request, p.PingRequest):
            return None
        data, _ = conn.server.send(p.PongReply(id=request.id, payload=request.payload))
        read_end, write_end = os.pipe()
        try:
            send_message(conn.sock, data, [read_end])  # the frame declares no fd
        finally:
            os.close(read_end)
            os.close(write_end)
            sent.set()
        return HANDLED

    before = open_fds()
    with npu_client.connect(peer.path, name="strays") as client:
        peer.intercept = with_stray_fd
        assert client.ping(b"one") == b"one"
        assert sent.wait(timeout=30)  # the peer has closed its copies
        assert open_fds() == before + 2  # the two ends of the connection, nothing more
        assert client.statistics().connection.fds_received == 0
    peer.wait_closed()
    assert open_fds() == before


def _too_many_fds(conn: PeerConnection, request: p.AnyRequest) -> object:
    """Answer a ping with its pong and more fds than any frame may carry (the
    client's ancillary buffer has room for 16: the kernel truncates)."""
    if not isinstance(request, p.PingRequest):
        return None
    data, _ = conn.server.send(p.PongReply(id=request.id, payload=request.payload))
    pipes = [os.pipe() for _ in range(10)]
    fds = [fd for pair in pipes for fd in pair]
    try:
        rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))
        conn.sock.sendmsg([data], [rights])
    finally:
        for fd in fds:
            os.close(fd)
    return HANDLED


def test_fds_truncated_by_the_kernel_end_the_connection_and_none_leak(peer: Peer) -> None:
    before = open_fds()
    with npu_client.connect(peer.path, name="ctrunc") as client:
        peer.intercept = _too_many_fds
        with pytest.raises(npu_client.FdsTruncated, match="MSG_CTRUNC"):
            client.ping(b"x")
        with pytest.raises(npu_client.FdsTruncated):
            client.ping(b"again")  # the connection is over, for the same reason
        assert client.statistics().closed
    peer.wait_closed()
    assert open_fds() == before


async def test_the_trio_client_handles_truncated_fds_the_same(peer: Peer) -> None:
    before = open_fds()
    async with npu_client.open_trio_client(peer.path, name="ctrunc") as npu:
        peer.intercept = _too_many_fds
        with pytest.raises(npu_client.FdsTruncated, match="MSG_CTRUNC"):
            await npu.ping(b"x")
        assert npu.statistics().closed
    peer.wait_closed()
    assert open_fds() == before

"""A daemon that stops reading must not hang the client: sends honour timeouts and cancellation."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import npu_client
import npu_protocol as p
from npu_client.trio_client import connect as trio_connect

URI = "file:///libecho_skel.so?echo_skel_handle_invoke"


class StallingDaemon:
    """Answers the Hello and one open, then never reads again."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        conn = p.ServerConnection()
        answered = 0
        while answered < 2:
            conn.receive_data(sock.recv(65536))
            while (event := conn.next_event()) is not p.NEED_DATA:
                reply: p.ServerMessage
                if isinstance(event, p.Hello):
                    reply = p.Welcome(
                        server_version="stall",
                        protocol_version=p.PROTOCOL_VERSION,
                        backend="emulator",
                        dsp=p.DspCapabilities(),
                        limits=p.ClientLimits(priority=event.priority),
                        epoch=1,
                    )
                else:
                    assert isinstance(event, p.OpenRequest)
                    reply = p.OpenReply(id=event.id, handle=1)
                sock.sendall(conn.send(reply)[0])
                answered += 1
        self.release.wait(30)  # never reads what the client sends next
        sock.close()

    def close(self) -> None:
        self.release.set()
        self.thread.join(10)
        self.listener.close()


@pytest.fixture
def stalling(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "stall.sock"
    daemon = StallingDaemon(path)
    yield path
    daemon.close()


BIG = bytes(900_000)  # a few of these fill the socket's buffers


def _flood(handle: npu_client.RemoteHandle) -> None:
    for _ in range(50):
        handle.invoke(2, [BIG], [])


def test_the_blocking_client_times_out_instead_of_hanging(stalling: Path) -> None:
    with npu_client.connect(str(stalling), name="stalled", timeout=0.5) as npu:
        handle = npu.open(URI)
        # A send cut off mid-frame also ends the connection: later calls say so.
        with pytest.raises((TimeoutError, npu_client.ConnectionClosedError)):
            _flood(handle)


def test_threads_queued_behind_a_blocked_send_time_out_too(stalling: Path) -> None:
    with npu_client.connect(str(stalling), name="stalled", timeout=0.5) as npu:
        handle = npu.open(URI)
        outcomes: list[str] = []

        def caller() -> None:
            try:
                for _ in range(50):
                    handle.invoke(2, [BIG], [])
            except (TimeoutError, npu_client.NpuError) as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=caller) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert not any(thread.is_alive() for thread in threads)
        assert len(outcomes) == 6


async def test_the_trio_client_can_be_cancelled_while_its_send_is_blocked(stalling: Path) -> None:
    npu = await trio_connect(str(stalling), name="stalled")
    try:
        handle = await npu.open(URI)
        with trio.move_on_after(0.5) as scope:
            for _ in range(50):
                await handle.invoke(2, [BIG], [])
        assert scope.cancelled_caught
    finally:
        await npu.aclose()

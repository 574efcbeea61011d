"""The holes a fault campaign found, each closed: npud as a real process, real clients."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import npu_client
import npu_protocol as p
from tests.e2e.daemon import Npud, RawPeer, start_npud

TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


def busy(request_id: int, handle: int, micros: int) -> p.InvokeRequest:
    return p.InvokeRequest(
        id=request_id,
        handle=handle,
        method=4,
        inputs=(p.InlineInput(data=struct.pack("<I", micros)),),
    )


def opened(peer: RawPeer) -> int:
    reply = peer.request(p.OpenRequest(id=peer.next_id(), uri=TEST_URI))
    assert isinstance(reply, p.OpenReply), reply
    return reply.handle


def as_user(
    uid: int,
    path: Path,
    work: Callable[[RawPeer], bytes],
    meanwhile: Callable[[], None] = lambda: None,
) -> bytes:
    """Run ``work`` on a connection made by a child process running as ``uid``; its
    result. ``work`` may call ``pause()`` (given as the peer's ``pause`` attribute):
    the parent then runs ``meanwhile`` (as root) before the child goes on. (Forked:
    this machine's interpreter may be out of that user's reach; the socket's directory
    is reached through an fd, so its parents' modes do not matter.)"""
    path.parent.chmod(0o711)
    directory = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    paused, resume = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        outcome = b"error"
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            peer = RawPeer.connect(Path(f"/proc/self/fd/{directory}/{path.name}"), timeout=30)

            def pause() -> None:
                os.write(paused[1], b"p")
                os.read(resume[0], 1)

            peer.pause = pause  # type: ignore[attr-defined]
            outcome = work(peer)
        except BaseException as exc:  # the child reports whatever happened
            outcome = repr(exc).encode()
        finally:
            os.write(write_end, outcome)
            os._exit(0)
    os.close(write_end)
    os.close(directory)
    os.close(paused[1])
    if os.read(paused[0], 1):  # the child paused: do what it waits for
        meanwhile()
        os.write(resume[1], b"r")
    for fd in (paused[0], resume[0], resume[1]):
        os.close(fd)
    try:
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


@pytest.fixture
def npud(tmp_path: Path) -> Iterator[Npud]:
    daemon = start_npud(
        tmp_path, "[daemon]\nsocket_mode = '0666'\n[access]\nallow_uids = [65534]\n"
    )
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def test_clients_leaving_any_way_cost_no_traceback(npud: Npud) -> None:
    """A half-close after a request, and pipelining clients SIGKILLed mid-pipeline."""
    for _ in range(30):
        peer = RawPeer.connect(npud.socket_path)
        peer.hello("half-close")
        peer.send(p.PingRequest(id=1, payload=b"x"))
        peer.sock.shutdown(socket.SHUT_WR)
        assert peer.receive() == p.PongReply(id=1, payload=b"x")
        assert isinstance(peer.receive(), p.ConnectionClosed)
        peer.close()
    script = (
        "import struct, sys, npu_client\n"
        f"with npu_client.connect(name='doomed') as npu, npu.open({TEST_URI!r}) as skel:\n"
        "    import threading\n"
        "    for _ in range(8):\n"
        "        threading.Thread(target=skel.invoke, args=(4, [struct.pack('<I', 200000)]), daemon=True).start()\n"
        "    print('READY', flush=True)\n"
        "    threading.Event().wait()\n"
    )
    env = {**os.environ, "NPUD_SOCKET": str(npud.socket_path)}
    for _ in range(10):
        child = subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        time.sleep(0.05)
        child.kill()
        child.wait()
        child.stdout.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with npu_client.connect(str(npud.socket_path), name="observer") as npu:
            if len(npu.status().clients) == 1:
                break
        time.sleep(0.1)
    log = npud.log()
    assert "Traceback" not in log
    assert '"level": "error"' not in log


def test_every_call_in_flight_or_queued_across_a_restart_is_told_dsp_restarted(
    tmp_path: Path,
) -> None:
    daemon = start_npud(tmp_path, "[scheduler]\ndsp_slots = 1\nrealtime_reserve = 0\n")
    try:
        peer = RawPeer.connect(daemon.socket_path)
        peer.hello("restarted")
        handle = opened(peer)
        for request_id in range(10, 16):  # one running, five queued behind it
            peer.send(busy(request_id, handle, 300_000))
        time.sleep(0.1)
        with npu_client.connect(str(daemon.socket_path), name="operator") as npu:
            npu.debug_fault("ssr", 0.5)
        codes: set[tuple[int, p.ErrorCode | None]] = set()
        while len(codes) < 6 and (answer := peer.receive()):
            if isinstance(answer, p.ErrorMessage) and answer.id is not None:
                codes.add((answer.id, answer.error_code))
            elif isinstance(answer, p.ConnectionClosed):
                break
        assert codes == {(i, p.ErrorCode.DSP_RESTARTED) for i in range(10, 16)}
        peer.close()
    finally:
        assert daemon.stop() == 0
    assert "unknown remote handle" not in daemon.log()


def test_shutdown_past_the_grace_answers_shutting_down_and_exits_in_time(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nshutdown_grace_s = 1.0\n")
    peer = RawPeer.connect(daemon.socket_path)
    peer.hello("patient")
    handle = opened(peer)
    peer.send(busy(7, handle, 120_000_000))  # a call of two minutes
    time.sleep(0.2)
    daemon.process.send_signal(signal.SIGTERM)
    assert isinstance(peer.receive(), p.ShuttingDown)
    answer = peer.receive()
    assert isinstance(answer, p.ErrorMessage), answer
    assert (answer.id, answer.error_code) == (7, p.ErrorCode.SHUTTING_DOWN)
    # npud is gone while the call still runs: past the grace it does not wait for the
    # call (the bound only stops a hang; the call would run for minutes).
    assert daemon.process.wait(20) == 0
    peer.close()


def test_a_reload_that_removes_a_user_closes_its_connections(tmp_path: Path) -> None:
    daemon = start_npud(
        tmp_path, "[daemon]\nsocket_mode = '0666'\n[access]\nallow_uids = [65534]\n"
    )
    config = daemon.config_path.read_text()

    def revoked(peer: RawPeer) -> bytes:
        peer.hello("soon-revoked")
        assert peer.request(p.PingRequest(id=1)) == p.PongReply(id=1)
        peer.pause()  # type: ignore[attr-defined]
        answer = peer.receive()
        after = peer.receive()
        return repr((answer, after)).encode()

    def reload_without_it() -> None:
        daemon.config_path.write_text(config.replace("allow_uids = [65534]", "allow_uids = []"))
        os.kill(daemon.pid, signal.SIGHUP)

    try:
        outcome = as_user(65534, daemon.socket_path, revoked, reload_without_it).decode()
        assert "NOT_PERMITTED" in outcome or "code=600" in outcome, outcome
        assert "no longer allowed to use npud" in outcome
        assert "ConnectionClosed" in outcome
    finally:
        assert daemon.stop() == 0
    assert '"revoked": 1' in daemon.log()


def test_a_misbehaving_peer_cannot_flood_the_log(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nlog_burst = 5\nlog_summary_interval_s = 60\n")
    try:
        peer = RawPeer.connect(daemon.socket_path)
        peer.hello("noisy")
        for request_id in range(2000):  # each refused: an unknown handle
            peer.send(busy(request_id % 1000, 99, 1))
            answer = peer.receive()
            assert isinstance(answer, p.ErrorMessage)
        peer.close()
        time.sleep(0.2)
    finally:
        assert daemon.stop() == 0
    log = daemon.log()
    assert log.count('"request refused"') <= 6  # the burst, and one summary at most
    assert '"held_back": ' in log  # the end of the connection says how many were held back


def test_a_call_that_never_returns_restarts_the_session(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\ncall_watchdog_s = 0.5\n")
    try:
        peer = RawPeer.connect(daemon.socket_path)
        peer.hello("hung")
        handle = opened(peer)
        answer = peer.request(busy(5, handle, 60_000_000))  # a minute: "never"
        assert isinstance(answer, p.ErrorMessage), answer
        assert (answer.id, answer.error_code) == (5, p.ErrorCode.DSP_RESTARTED)
        assert isinstance(peer.receive(), p.SessionRestarted)
        peer.close()
        with npu_client.connect(str(daemon.socket_path), name="after") as npu:
            assert npu.status().restarts == 1
            assert npu.ping(b"ok") == b"ok"
    finally:
        assert daemon.stop() == 0
    assert "a DSP call never returned" in daemon.log()


def test_debug_faults_need_root(npud: Npud) -> None:
    def try_it(peer: RawPeer) -> bytes:
        peer.hello("not-root")
        return repr(peer.request(p.DebugRequest(id=1, action="ssr", duration_ms=100))).encode()

    outcome = as_user(65534, npud.socket_path, try_it).decode()
    assert "debug faults need root" in outcome, outcome


def test_npuctl_debug_restarts_the_emulated_dsp(npud: Npud) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_client.npuctl", "--socket", str(npud.socket_path),
         "debug", "ssr", "--seconds", "0.2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "subsystem restart: the DSP is away for 0.2 s"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with npu_client.connect(str(npud.socket_path), name="observer") as npu:
            if npu.status().restarts == 1:
                break
        time.sleep(0.05)
    else:
        raise AssertionError("the session did not come back")


def welcome_of(npud: Npud, name: str) -> p.Welcome:
    peer = RawPeer.connect(npud.socket_path)
    try:
        return peer.hello(name)
    finally:
        peer.close()


def domain_state(npud: Npud) -> str:
    """The default domain's state, as status tells a client that just connected."""
    peer = RawPeer.connect(npud.socket_path)
    try:
        peer.hello("watcher")
        while True:
            reply = peer.request(p.StatusRequest(id=peer.next_id()))
            if isinstance(reply, p.StatusReply):
                break
        rows = {row.name: row for row in reply.status.domains}
        return rows["default"].state
    finally:
        peer.close()


def test_a_welcome_during_an_outage_shows_no_stale_capabilities(npud: Npud) -> None:
    operator = RawPeer.connect(npud.socket_path)
    try:
        up = operator.hello("operator")
        assert up.dsp.arch_ver != 0
        operator.request(p.DebugRequest(id=1, action="ssr", duration_ms=1500))
        # npud learns of the restart from the DSP (its listener's EPIPE), a moment after
        # the fault: once it knows, a Welcome carries no capabilities (not the old
        # epoch's as if current).
        deadline = time.monotonic() + 5
        while domain_state(npud) == "up":
            assert time.monotonic() < deadline, "npud never noticed the restart"
            time.sleep(0.005)
        assert welcome_of(npud, "during").dsp == p.DspCapabilities()
    finally:
        operator.close()
    deadline = time.monotonic() + 20
    while (again := welcome_of(npud, "after")).dsp.arch_ver == 0:
        assert time.monotonic() < deadline, "the DSP did not come back"
        time.sleep(0.05)
    assert again.dsp == up.dsp
    assert again.epoch > up.epoch

"""npud as a real subprocess, driven by real client processes, some of them killed or hostile."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import npu_client
import npu_protocol as p
from tests.e2e.daemon import Npud, RawPeer, start_npud

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


@pytest.fixture
def npud(tmp_path: Path) -> Iterator[Npud]:
    daemon = start_npud(tmp_path, "[daemon]\nsocket_mode = '0666'\n")
    yield daemon
    assert daemon.stop() == 0, daemon.log()
    assert '"level": "error"' not in daemon.log()


def client_env(npud: Npud) -> dict[str, str]:
    return {**os.environ, "NPUD_SOCKET": str(npud.socket_path)}


def spawn(npud: Npud, script: str) -> subprocess.Popen[str]:
    """A client process; it prints READY once it holds what the test is about."""
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=client_env(npud),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "READY", (line, process.stderr.read() if process.stderr else "")


def status(npud: Npud) -> p.DaemonStatus:
    with npu_client.connect(str(npud.socket_path), name="observer") as npu:
        return npu.status()


def wait_until_clean(npud: Npud, baseline_fds: int, timeout: float = 20.0) -> p.DaemonStatus:
    """Nothing of departed clients left: only the observer, no buffers, fds back to baseline."""
    deadline = time.monotonic() + timeout
    while True:
        current = status(npud)
        time.sleep(0.05)  # let the daemon see the observer's own connection close
        clean = current.totals == p.Totals(clients=1, calls_done=current.totals.calls_done)
        if clean and npud.open_fds() == baseline_fds:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(
                f"leftovers: {current.totals}, fds {npud.open_fds()} vs {baseline_fds}"
            )
        time.sleep(0.05)


def baseline(npud: Npud) -> int:
    status(npud)  # warm up: first connection, lazy imports in the daemon
    time.sleep(0.1)
    return npud.open_fds()


def test_selftest_through_npuctl(npud: Npud) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_client.npuctl", "selftest"],
        env=client_env(npud),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "selftest passed" in result.stdout


def test_npuctl_status_json(npud: Npud) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_client.npuctl", "status", "--json"],
        env=client_env(npud),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["backend"] == "emulator"
    assert data["dsp"]["arch_ver"] == 0x73
    assert data["shell"]["verified"] is True
    assert data["epoch"] == 1


MANY = """
import os, struct, zlib, npu_client
with npu_client.connect(name="worker") as npu:
    with npu.open("{uri}") as test, npu.alloc(65536) as buf:
        buf.map()
        for seed in range(20):
            test.invoke(2, [struct.pack("<II", seed, 65536)], [buf.slice(0, 65536)])
            (crc,) = struct.unpack("<I", test.invoke(3, [struct.pack("<I", 65536), buf.slice(0, 65536)], [4])[0])
            assert crc == zlib.crc32(bytes(buf.view())), seed
    [me] = [row for row in npu.status().clients if row.pid == os.getpid()]
print("DONE", me.calls_done, me.buffers, me.handles)
"""


def test_many_clients_at_once(npud: Npud) -> None:
    fds = baseline(npud)
    workers = [spawn(npud, MANY.format(uri=TEST_URI)) for _ in range(8)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        # The daemon counted each worker's 40 DSP calls, and had released its
        # buffer and handle when the worker's with-blocks ended.
        assert out.strip() == "DONE 40 0 0"
    wait_until_clean(npud, fds)


IDLE = """
import npu_client, time
npu = npu_client.connect(name="idle")
npu.open("{uri}")
print("READY", flush=True)
time.sleep(600)
"""

HOARDER = """
import npu_client, time
npu = npu_client.connect(name="hoarder")
buffers = [npu.alloc(8192) for _ in range(100)]
for b in buffers[:50]:
    b.map()
print("READY", flush=True)
time.sleep(600)
"""

BUSY = """
import struct, npu_client
npu = npu_client.connect(name="busy")
test = npu.open("{uri}")
buf = npu.alloc(4096)
print("READY", flush=True)
test.invoke(3, [struct.pack("<I", 4096), buf.slice(0, 4096)], [4])
test.invoke(4, [struct.pack("<I", 1_500_000)], [])   # killed in here
"""


@pytest.mark.parametrize(
    ("script", "holding"),
    [(IDLE, "idle"), (HOARDER, "100 buffers"), (BUSY, "an invoke on the DSP")],
)
def test_a_sigkilled_client_leaves_nothing_behind(npud: Npud, script: str, holding: str) -> None:
    fds = baseline(npud)
    victim = spawn(npud, script.format(uri=TEST_URI))
    try:
        wait_ready(victim)
        held = status(npud).totals
        if holding == "100 buffers":
            assert held.buffers == 100
            assert held.mappings == 50
        if holding == "an invoke on the DSP":
            deadline = time.monotonic() + 10
            while status(npud).totals.calls_in_flight == 0:
                assert time.monotonic() < deadline, "the invoke never started"
                time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        for stream in (victim.stdout, victim.stderr):
            if stream:
                stream.close()
    wait_until_clean(npud, fds)


def test_a_peer_not_on_the_allow_list_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to become another user")
    # A directory the other user may traverse, and a socket anyone may connect
    # to: what stops the stranger is the allow-list, not the file mode.
    reachable = tmp_path_factory.mktemp("reachable")
    for directory in (reachable, *reachable.parents):
        if directory == Path("/tmp"):
            break
        directory.chmod(0o755)
    npud = start_npud(reachable, "[daemon]\nsocket_mode = '0666'\n")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes nobody and tries its luck
        verdict = b"no verdict"
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            peer = RawPeer.connect(npud.socket_path)
            peer.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="intruder"))
            answer = peer.receive()
            refused = (
                isinstance(answer, p.ErrorMessage) and answer.code == p.ErrorCode.NOT_PERMITTED
            )
            verdict = b"refused" if refused else repr(answer).encode()[:300]
        except BaseException as exc:
            verdict = repr(exc).encode()[:300]
        finally:
            os.write(write_end, verdict)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        verdict = pipe.read()
    os.waitpid(pid, 0)
    try:
        assert verdict == b"refused"
        assert '"uid": 65534' in npud.log()
        assert "not on the allow-list" in npud.log()
    finally:
        assert npud.stop() == 0


def test_quotas_refuse_with_the_right_code(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[client_limits]\nmax_buffers = 2\nmax_handles = 1\n")
    try:
        with npu_client.connect(str(daemon.socket_path), name="greedy") as npu:
            kept = [npu.alloc(4096), npu.alloc(4096)]
            with pytest.raises(npu_client.QuotaExceeded) as caught:
                npu.alloc(4096)
            assert caught.value.code == p.ErrorCode.QUOTA_EXCEEDED
            assert "buffers quota exceeded: the limit is 2" in str(caught.value)
            npu.open(ECHO_URI)
            with pytest.raises(npu_client.QuotaExceeded):
                npu.open(ECHO_URI)
            for buffer in kept:
                buffer.free()
            npu.alloc(4096)  # room again
    finally:
        assert daemon.stop() == 0


def _other_client_works(npud: Npud) -> None:
    with (
        npu_client.connect(str(npud.socket_path), name="bystander") as npu,
        npu.open(ECHO_URI) as echo,
    ):
        out = echo.invoke(2, [struct.pack("<II", 2, 2), b"ok"], [2])
        assert out == [b"ok"]


def _raw(npud: Npud) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(npud.socket_path))
    return sock


def _closed_after_error(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


@pytest.mark.parametrize(
    "attack",
    [
        "garbage",
        "oversized-prefix",
        "surplus-fds",
        "fds-with-a-frame-begun",
        "stops-mid-frame",
        "request-before-hello",
    ],
)
def test_hostile_clients_get_an_error_or_a_close_while_others_carry_on(
    npud: Npud, attack: str
) -> None:
    fds = baseline(npud)
    sock = _raw(npud)
    if attack == "garbage":
        sock.sendall(b"\x00\xffGET / HTTP/1.1\r\n\r\n" * 10)
        reply = _closed_after_error(sock)
        assert reply[:2] == p.FRAME_MAGIC  # one error frame, then the close
    elif attack == "oversized-prefix":
        sock.sendall(p.FRAME_MAGIC + b"\x00\x00" + struct.pack("<I", 0xFFFFFFFF))
        assert _closed_after_error(sock)[:2] == p.FRAME_MAGIC
    elif attack == "surplus-fds":
        hello = p.ClientConnection()
        data, _ = hello.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="fd-spammer"))
        r, w = os.pipe()
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("ii", r, w))])
        os.close(r)
        os.close(w)
        hello.receive_data(sock.recv(65536))
        assert isinstance(hello.next_event(), p.Welcome)  # the fds were closed, not kept
        sock.close()
    elif attack == "fds-with-a-frame-begun":
        # Fds on the first byte of a frame that never comes, then a hang-up: the
        # protocol holds them for that frame until the connection ends.
        hello = p.ClientConnection()
        data, _ = hello.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="fd-dangler"))
        sock.sendall(data)
        time.sleep(0.1)  # welcomed: the link reads from here
        r, w = os.pipe()
        sock.sendmsg([b"\x00"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("ii", r, w))])
        os.close(r)
        os.close(w)
        time.sleep(0.1)  # read by the daemon before the hang-up
        sock.close()
    elif attack == "stops-mid-frame":
        hello = p.ClientConnection()
        data, _ = hello.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="half"))
        sock.sendall(data[: len(data) // 2])
        _other_client_works(npud)  # while this one dangles mid-frame
        sock.close()
    else:  # a peer that skips the Hello
        body = msgspec.msgpack.encode({"type": "ping", "id": 1})
        sock.sendall(p.FRAME_MAGIC + b"\x00\x00" + struct.pack("<I", len(body)) + body)
        assert _closed_after_error(sock)[:2] == p.FRAME_MAGIC
    _other_client_works(npud)
    wait_until_clean(npud, fds)
    assert npud.process.poll() is None


SLOW = """
import struct, npu_client
events = []
npu = npu_client.connect(name="slow", on_event=events.append)
test = npu.open("{uri}")
print("READY", flush=True)
test.invoke(4, [struct.pack("<I", 1_000_000)], [])   # SIGTERM arrives meanwhile
print("DONE", type(events[0]).__name__ if events else "no event", flush=True)
"""


def test_sigterm_lets_calls_on_the_dsp_finish_and_tells_clients(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nshutdown_grace_s = 10.0\n")
    worker = spawn(daemon, SLOW.format(uri=TEST_URI))
    try:
        wait_ready(worker)
        deadline = time.monotonic() + 10
        while status(daemon).totals.calls_in_flight == 0:
            assert time.monotonic() < deadline, "the invoke never started"
            time.sleep(0.01)
        daemon.process.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert out.splitlines()[-1] == "DONE ShuttingDown"  # the call finished, the client was told
        assert daemon.process.wait(30) == 0
        assert not daemon.socket_path.exists()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        daemon.stop()


def test_silent_connections_cannot_shut_clients_out(tmp_path: Path) -> None:
    """80 sockets that connect and say nothing (slowloris) hold only the handshake slots
    of their own user, for hello_timeout_s at most; another user still gets in."""
    daemon = start_npud(
        tmp_path,
        "[daemon]\nsocket_mode = '0666'\nmax_handshakes_per_uid = 8\nhello_timeout_s = 2.0\n"
        "[access]\nallow_uids = [65534]\n",
    )
    silent: list[socket.socket] = []
    try:
        for _ in range(80):
            silent.append(_raw(daemon))
        time.sleep(0.3)  # let the daemon accept them all
        extra = _raw(daemon)
        answer = p.ClientConnection()
        data, _ = answer.send(
            p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="one-too-many")
        )
        extra.sendall(data)
        answer.receive_data(_closed_after_error(extra))
        refusal = answer.next_event()
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.code == p.ErrorCode.QUOTA_EXCEEDED
        assert refusal.message == (
            "connections of this user before Hello quota exceeded: the limit is 8"
        )
        # Another user is not shut out by them.
        assert _ping_as(65534, daemon.socket_path) == "pong"
    finally:
        for sock in silent:
            sock.close()
        assert daemon.stop() == 0
    log = daemon.log()
    # The refused connections' lines are held back past the budget, not logged 72 times.
    assert log.count("too many waiting for their Hello") < 40
    assert "Traceback" not in log


def _ping_as(uid: int, path: Path) -> str:
    """Hello and ping from a child process running as ``uid`` (forked: the interpreter
    of this machine's venv may be out of that user's reach). The socket's directory is
    reached through an fd opened before, so its parents' modes do not matter."""
    path.parent.chmod(0o711)
    directory = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, talk, report through the pipe
        outcome = b"error"
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            peer = RawPeer.connect(Path(f"/proc/self/fd/{directory}/{path.name}"))
            peer.hello("other-user")
            peer.send(p.PingRequest(id=1, payload=b"x"))
            answer = peer.receive()
            outcome = (
                b"pong" if answer == p.PongReply(id=1, payload=b"x") else repr(answer).encode()
            )
        finally:
            os.write(write_end, outcome)
            os._exit(0)
    os.close(write_end)
    os.close(directory)
    try:
        return os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_a_client_that_stops_mid_frame_is_dropped(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nframe_timeout_s = 0.5\n")
    try:
        peer = RawPeer.connect(daemon.socket_path)
        peer.hello("stalls")
        frame, _ = peer.protocol.send(p.PingRequest(id=1, payload=b"x" * 100))
        peer.sock.sendall(frame[:20])  # a frame begun and never finished
        peer.sock.settimeout(10)
        assert peer.sock.recv(100) == b""  # dropped
        peer.sock.close()
    finally:
        assert daemon.stop() == 0
    assert '"reason": "left a frame half sent"' in daemon.log()

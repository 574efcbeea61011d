"""npud started the way systemd starts it: a passed listening fd, NOTIFY_SOCKET, WATCHDOG_USEC."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import npu_protocol as p
from npud.daemon.sd import ANNOUNCE_PATIENCE, Notifier, activated_socket, watchdog_interval
from tests.e2e.daemon import RawPeer

# Runs in the child: put the listening socket at fd 3 and claim LISTEN_PID, as
# systemd does between fork and exec.
ACTIVATE = """
import os, sys
fd = int(os.environ.pop("TEST_LISTEN_FD"))
os.dup2(fd, 3)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_FDNAMES"] = "npud.socket"
os.execv(sys.executable, [sys.executable, "-m", "npud.daemon.main", *sys.argv[1:]])
"""


class NotifyListener:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, value: str | None = None, timeout: float = 20.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        for message in self.messages:
            if key in message and (value is None or message[key] == value):
                self.messages.remove(message)
                return message
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            message = dict(line.split("=", 1) for line in data.decode().splitlines())
            if key in message and (value is None or message[key] == value):
                return message
            self.messages.append(message)
        raise AssertionError(f"no {key}={value} from npud; saw {self.messages}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(tmp_path / "notify.sock")
    yield listener
    listener.close()


def test_npud_under_systemd(tmp_path: Path, notify: NotifyListener) -> None:
    socket_path = tmp_path / "activated.sock"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(socket_path))
    listening.listen(16)
    config = tmp_path / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n[client_limits]\nmax_buffers = 256\n")
    log_path = tmp_path / "npud.log"
    env = {
        **os.environ,
        "TEST_LISTEN_FD": str(listening.fileno()),
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": "200000",
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", ACTIVATE, "--config", str(config), "--log-format", "json"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(listening.fileno(),),
        )
    listening.close()  # the daemon holds its own copy, as under systemd
    try:
        ready = notify.wait_for("READY", "1")
        assert "DSP up (emulator, v73, epoch 1)" in ready["STATUS"]
        notify.wait_for("WATCHDOG", "1")
        notify.wait_for("WATCHDOG", "1")  # repeatedly, while healthy

        peer = RawPeer.connect(socket_path)
        assert peer.hello().limits.max_buffers == 256
        assert '"socket_activated": true' in log_path.read_text()

        # SIGHUP: the new limit applies to new clients; the old client stays connected.
        config.write_text("[backend]\nkind = 'emulator'\n[client_limits]\nmax_buffers = 7\n")
        process.send_signal(signal.SIGHUP)
        reloading = notify.wait_for("RELOADING", "1")
        assert int(reloading["MONOTONIC_USEC"]) > 0
        notify.wait_for("READY", "1")
        second = RawPeer.connect(socket_path)
        assert second.hello(name="after-reload").limits.max_buffers == 7
        status = peer.request(p.StatusRequest(id=peer.next_id()))
        assert isinstance(status, p.StatusReply)
        assert status.status.totals.clients == 2

        # A bad config on reload keeps the running one.
        config.write_text("[client_limits]\nmax_buffers = 'many'\n")
        process.send_signal(signal.SIGHUP)
        failed = notify.wait_for("READY", "1")
        assert "reload failed" in failed["STATUS"]
        peer.close()
        second.close()

        process.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING", "1")
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # systemd owns the socket file: npud leaves it in place.
    assert socket_path.exists()


def test_status_lines_report_activity(tmp_path: Path, notify: NotifyListener) -> None:
    notifier = Notifier(str(notify.path))
    assert notifier.enabled
    assert notifier.status("3 clients; DSP up")
    assert notify.wait_for("STATUS")["STATUS"] == "3 clients; DSP up"
    notifier.close()
    assert not notifier.status("closed")


def _fill(path: Path) -> int:
    """Fill the queue of the datagram socket at ``path`` as a reader that stopped reading
    leaves it; the number of datagrams it took."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as filler:
        for count in itertools.count():
            try:
                filler.sendto(b"FILLER=1", str(path))
            except BlockingIOError:
                return count
    raise AssertionError("unreachable")


def _drain(notify: NotifyListener) -> list[bytes]:
    datagrams = []
    while True:
        try:
            datagrams.append(notify.sock.recv(4096, socket.MSG_DONTWAIT))
        except BlockingIOError:
            return datagrams


def test_a_full_notify_queue_drops_routine_messages_and_never_blocks(
    notify: NotifyListener,
) -> None:
    """Issue 27: with a reader that stopped reading, sendto blocked npud's event loop for
    good. A routine message is dropped instead; the call returns at once."""
    notifier = Notifier(str(notify.path))
    try:
        assert _fill(notify.path) > 0
        outcome: list[bool] = []
        sender = threading.Thread(
            target=lambda: outcome.extend([notifier.status("busy"), notifier.watchdog()])
        )
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "sd_notify blocked on a full queue"
        assert outcome == [False, False]
        assert notifier.dropped == 2
        assert not notifier.waiting  # routine messages are not kept
        assert b"STATUS=busy" not in _drain(notify)
        assert notifier.status("again")
        assert notify.sock.recv(4096) == b"STATUS=again"
    finally:
        notifier.close()


def test_a_state_change_waits_for_room_in_order_within_its_patience(
    notify: NotifyListener,
) -> None:
    now = [100.0]
    notifier = Notifier(str(notify.path), clock=lambda: now[0])
    try:
        _fill(notify.path)
        assert not notifier.ready("up")  # kept: READY=1 is worth waiting for
        assert notifier.waiting
        assert not notifier.status("later")  # never before the READY=1 it would overtake
        assert not notifier.stopping()
        now[0] += ANNOUNCE_PATIENCE / 2
        assert notifier.flush()  # still no room, still within patience
        assert set(_drain(notify)) == {b"FILLER=1"}  # the reader reads again
        assert not notifier.flush()  # room: both sent, in order
        assert _drain(notify) == [b"READY=1\nSTATUS=up", b"STOPPING=1\nSTATUS=stopping"]
        assert notifier.dropped == 1  # the STATUS= that came while READY=1 waited

        _fill(notify.path)
        assert not notifier.reloading()
        now[0] += ANNOUNCE_PATIENCE + 0.1
        assert not notifier.flush()  # its patience spent: given up, not kept for ever
        assert not notifier.waiting
        assert notifier.dropped == 2
    finally:
        notifier.close()


def test_notifier_is_quiet_outside_systemd() -> None:
    quiet = Notifier("")
    assert not quiet.enabled
    assert not quiet.ready("x")


def test_abstract_notify_socket() -> None:
    name = f"npud-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    notifier = Notifier("@" + name)
    try:
        assert notifier.watchdog()
        assert sock.recv(100) == b"WATCHDOG=1"
    finally:
        notifier.close()
        sock.close()


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    assert watchdog_interval() == 2.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 2.0
    monkeypatch.setenv("WATCHDOG_USEC", "junk")
    assert watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval() is None


def test_activation_for_another_process_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", "1")
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert activated_socket() is None
    assert "LISTEN_FDS" not in os.environ  # unset so no child takes it for its own
    monkeypatch.delenv("LISTEN_PID", raising=False)
    assert activated_socket() is None


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("two", "passed 2 sockets"),
        ("udp", "is not an AF_UNIX socket"),
        ("dgram", "is not a stream socket"),
        ("unlistened", "is not listening"),
        ("file", "is not a socket"),
    ],
)
def test_a_wrongly_activated_npud_refuses_to_start(tmp_path: Path, kind: str, message: str) -> None:
    if kind == "udp":
        sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    elif kind == "dgram":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / "d.sock"))
    elif kind in ("unlistened", "two"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(tmp_path / "s.sock"))
        if kind == "two":
            sock.listen(1)
    else:
        sock = None
    fd = sock.fileno() if sock else os.open(tmp_path / "npud.toml", os.O_CREAT | os.O_RDWR)
    (tmp_path / "npud.toml").write_text("[backend]\nkind = 'emulator'\n")
    script = ACTIVATE.replace('"1"', '"2"', 1) if kind == "two" else ACTIVATE
    result = subprocess.run(
        [sys.executable, "-c", script, "--config", str(tmp_path / "npud.toml")],
        env={**os.environ, "TEST_LISTEN_FD": str(fd)},
        pass_fds=(fd,),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if sock:
        sock.close()
    else:
        os.close(fd)
    assert result.returncode == 78  # EX_CONFIG: the unit passed the wrong fds
    assert message in result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback


TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.add(int(entry.name))
                pending.append(int(entry.name))
    return found


def test_an_endless_call_neither_stops_the_watchdog_nor_shutdown(
    tmp_path: Path, notify: NotifyListener
) -> None:
    """A call that never ends runs in its client's own DSP process (a child process on
    the emulator): npud keeps pinging systemd within WatchdogSec all the while, and
    SIGTERM still stops it, ending that process and its child (issue 16, item 3)."""
    from tests.e2e.daemon import start_npud

    config = (
        "[daemon]\ncall_watchdog_s = 0\nshutdown_grace_s = 0.5\n"
        "[[domains.rule]]\nname = 'spin'\nclients = ['spinner']\nisolate = true\n"
    )
    watchdog_sec = 1.0
    daemon = start_npud(
        tmp_path,
        config,
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(int(watchdog_sec * 1e6))},
    )
    try:
        notify.wait_for("READY", "1")
        spinner = RawPeer.connect(daemon.socket_path)
        assert spinner.hello(name="spinner").domain == "spin#1"
        opened = spinner.request(p.OpenRequest(id=spinner.next_id(), uri=TEST_URI))
        assert isinstance(opened, p.OpenReply)
        spinner.send(  # busy for 4294 s: for ever, as far as this test goes
            p.InvokeRequest(
                id=spinner.next_id(),
                handle=opened.handle,
                sc=0x04010000,
                inputs=(p.InlineInput(data=(0xFFFFFFFF).to_bytes(4, "little")),),
            )
        )
        children = _descendants(daemon.pid)
        notify.messages.clear()  # from here on, each ping is timed as it arrives
        pings = []
        deadline = time.monotonic() + 4 * watchdog_sec
        while time.monotonic() < deadline:
            notify.wait_for("WATCHDOG", "1", timeout=watchdog_sec)
            pings.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < watchdog_sec, gaps
        daemon.process.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING", "1")
        assert daemon.process.wait(20) == 0
        spinner.close()
        alive = {pid for pid in children if Path(f"/proc/{pid}").exists()}
        assert not alive, f"left running after npud stopped: {alive}"
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


@pytest.mark.parametrize("reader", ["reads again after SIGTERM", "never reads again"])
def test_npud_serves_and_stops_with_a_notify_socket_nobody_reads(
    tmp_path: Path, notify: NotifyListener, reader: str
) -> None:
    """Issue 27: a supervisor that stopped reading NOTIFY_SOCKET once wedged npud: the
    next sd_notify blocked its event loop, no client was welcomed and SIGTERM did
    nothing. Now routine messages are dropped (and said to be, in the log), npud goes
    on serving, and STOPPING=1 is retried while the reader has no room."""
    from tests.e2e.daemon import start_npud

    daemon = start_npud(
        tmp_path,
        "[daemon]\nshutdown_grace_s = 0.5\n",
        # A ping every 0.1 s: the queue is met full at once, not after a STATUS interval.
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000"},
    )
    try:
        notify.wait_for("READY", "1")
        _fill(notify.path)
        time.sleep(0.5)  # pings meet the full queue
        peer = RawPeer.connect(daemon.socket_path)
        assert peer.hello(name="after-the-queue-filled").domain
        status = peer.request(p.StatusRequest(id=peer.next_id()))
        assert isinstance(status, p.StatusReply)
        peer.close()
        deadline = time.monotonic() + 20
        while "the notify socket takes no more messages" not in daemon.log():
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        daemon.process.send_signal(signal.SIGTERM)
        if reader == "reads again after SIGTERM":
            notify.messages.clear()
            notify.wait_for("STOPPING", "1")
        assert daemon.process.wait(20) == 0, daemon.log()
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()

"""Start npud as a real subprocess on a temporary socket, and a raw protocol peer for it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import npu_protocol as p
from npu_client.transport import OwnedFd, recv_message, send_message

READY_TIMEOUT = 30.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Npud:
    process: subprocess.Popen[bytes]
    socket_path: Path
    log_path: Path
    config_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"npud did not stop on SIGTERM; log:\n{self.log()}") from None

    def open_fds(self) -> int:
        return open_fds(self.pid)


def start_npud(
    tmp: Path,
    config: str = "",
    *,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> Npud:
    socket_path = tmp / "npud.sock"
    config_path = tmp / "npud.toml"
    config_path.write_text("[backend]\nkind = 'emulator'\n" + config)
    log_path = tmp / "npud.log"
    args = [
        sys.executable, "-m", "npud.daemon.main", "--config", str(config_path),
        "--socket", str(socket_path), "--log-format", "json", *extra_args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    daemon = Npud(process, socket_path, log_path, config_path)
    if wait:
        wait_until_serving(daemon)
    return daemon


def wait_until_serving(daemon: Npud) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise AssertionError(f"npud exited with {daemon.process.returncode}:\n{daemon.log()}")
        if '"event": "ready"' in daemon.log():
            return
        time.sleep(0.02)
    daemon.process.kill()
    raise AssertionError(f"npud did not become ready:\n{daemon.log()}")


@dataclass
class RawPeer:
    """A protocol client at the byte level, for tests that must misbehave."""

    sock: socket.socket
    protocol: p.ClientConnection = field(default_factory=p.ClientConnection)
    received_fds: list[OwnedFd] = field(default_factory=list)

    @classmethod
    def connect(cls, path: Path, *, timeout: float = 10.0) -> RawPeer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(path))
        return cls(sock)

    def send(self, message: p.ClientMessage) -> None:
        data, fds = self.protocol.send(message)
        send_message(self.sock, data, fds)

    def receive(self) -> p.ServerMessage | p.ConnectionClosed:
        while True:
            event = self.protocol.next_event()
            if event is p.NEED_DATA:
                data, fds = recv_message(self.sock)
                self.received_fds.extend(fds)
                self.protocol.receive_data(data, [fd.fileno() for fd in fds])
                continue
            if isinstance(event, p.StrayFds):
                continue
            return event

    def hello(self, name: str = "raw", priority: p.Priority = p.Priority.NORMAL) -> p.Welcome:
        self.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=name, priority=priority))
        welcome = self.receive()
        assert isinstance(welcome, p.Welcome), welcome
        return welcome

    def request(self, message: p.AnyRequest) -> p.ServerMessage | p.ConnectionClosed:
        self.send(message)
        return self.receive()

    def next_id(self) -> int:
        return self.protocol.next_request_id()

    def close(self) -> None:
        self.sock.close()
        for fd in self.received_fds:
            fd.close()

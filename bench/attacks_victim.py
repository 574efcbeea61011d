"""The attack bench's victim: a user running the Silero VAD model every 32 ms, holding a
buffer with a secret in it mapped into its DSP process; and its isolated Hello."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import npu_client
import npu_protocol as p
from bench.attacks_users import tell
from bench.processes import START_TIMEOUT
from npu_client.transport import recv_message, send_message

PERIOD_S: Final = 0.032
SECRET: Final = b"SECRET-of-the-victim-0123456789a" * 2


def preload(socket_path: Path, model: BinaryIO) -> None:
    """One VAD run as root first: what the children need is imported before they drop to
    a user who may not reach this interpreter's files (a Python under a private home)."""
    import numpy as np  # noqa: PLC0415 - the daemon's benches need no numpy

    from bench.model_vad import SHAPES  # noqa: PLC0415

    with npu_client.connect(str(socket_path), name="attacks-preload") as npu:
        vad = npu.load_model(model, shapes=SHAPES)
        vad.set_input("sr", np.array(16000, np.int64))
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        vad.set_input("input", np.zeros((1, 576), np.float32))
        vad.execute()
        np.random.default_rng(7)


def victim_runs(model: BinaryIO) -> Callable[[Path, BinaryIO, BinaryIO], None]:
    def work(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
        import numpy as np  # noqa: PLC0415 - imported by preload already

        from bench.model_vad import SHAPES  # noqa: PLC0415

        npu = npu_client.connect(str(path), name="vad-victim")
        secret = npu.alloc(4096)
        secret.view()[: len(SECRET)] = SECRET
        secret.map()

        def loaded() -> Any:
            model.seek(0)
            vad = npu.load_model(model, shapes=SHAPES)
            vad.set_input("sr", np.array(16000, np.int64))
            vad.set_input("state", np.zeros((2, 1, 128), np.float32))
            return vad

        vad = loaded()
        chunk = np.random.default_rng(7).uniform(-0.5, 0.5, (1, 576)).astype(np.float32)
        for _ in range(30):
            vad.set_input("input", chunk)
            vad.execute()
        tell(outbox, "ready")
        runs: list[tuple[float, float, bool]] = []
        stop = threading.Event()

        def until_told() -> None:
            inbox.readline()
            stop.set()

        threading.Thread(target=until_told, daemon=True).start()
        tick = time.monotonic()
        while not stop.is_set():
            began = time.monotonic()
            try:
                vad.set_input("input", chunk)
                vad.execute()
                runs.append((began, time.monotonic() - began, True))
            except npu_client.NpuError:
                runs.append((began, time.monotonic() - began, False))
                with contextlib.suppress(npu_client.NpuError):
                    vad = loaded()
            tick += PERIOD_S
            time.sleep(max(0.0, tick - time.monotonic()))
        tell(outbox, runs)

    return work


def isolated_hello(path: Path, name: str) -> tuple[socket.socket, p.Welcome | p.ErrorMessage]:
    """A Hello asking for a DSP process of its own (npu_client never asks; libcdsprpc
    always does); the socket stays open."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(START_TIMEOUT)
    sock.connect(str(path))
    conn = p.ClientConnection()
    data, _ = conn.send(
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=name, isolate=True)
    )
    send_message(sock, data, [])
    while True:
        event = conn.next_event()
        if event is p.NEED_DATA:
            received, fds = recv_message(sock)
            for fd in fds:
                fd.close()
            conn.receive_data(received, [])
            continue
        assert isinstance(event, p.Welcome | p.ErrorMessage), event
        return sock, event


def victim_isolates(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
    sock, answer = isolated_hello(path, "llama-victim")
    sock.close()
    tell(outbox, isinstance(answer, p.Welcome))

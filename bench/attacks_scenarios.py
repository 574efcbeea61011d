"""The attack bench's scenarios through npud, each run as the attacker's user:
``(socket path, seconds) -> figures`` (the module's docstring, bench/attacks.py, says
what each does and measures), and their order."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import npu_client
import npu_protocol as p
from bench.attacks_parse import MIB, tiny_fields_model
from bench.attacks_users import tell
from bench.attacks_victim import isolated_hello
from bench.processes import START_TIMEOUT
from npu_client.transport import fds_ancillary

TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DSPQUEUE_URI: Final = (
    "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0"
    "&_dom=cdsp&_session=0"
)
SCAN_FDS: Final = 512
ENOSUCHMAP: Final = 0x80000441 & 0xFFFFFFFF


def idle_attacker(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
    """The attacker's user connected and doing nothing: part of the quiet baseline (a
    user's first connection opens its DSP process, which any user may). Tells
    "connected", or ``{"error": ...}`` when npud refused it."""
    try:
        npu = npu_client.connect(str(path), name="attacker-idle")
    except npu_client.NpuError as exc:
        tell(outbox, {"error": f"{type(exc).__name__}: {exc}"})
        return
    with npu:
        tell(outbox, "connected")
        inbox.readline()


def _open(npu: npu_client.Client, uri: str) -> Any:
    """Open ``uri``, again while the attacker's domain restarts."""
    for _ in range(200):
        try:
            return npu.open(uri)
        except npu_client.DspRestarted:
            time.sleep(0.05)
    return npu.open(uri)


def cross_user(path: Path, seconds: float) -> dict[str, float]:
    npu = npu_client.connect(str(path), name="attacker")
    queue = _open(npu, DSPQUEUE_URI)
    reached = 0
    for fd in range(3, SCAN_FDS):
        try:
            queue.invoke(2, [struct.pack("<i", fd)])
            reached += 1  # init_process_state mapped what the fd names
        except npu_client.InvokeFailed:
            pass
    npu.close()
    return {"attacker_reached": reached}


def isolate_hog(path: Path, seconds: float) -> dict[str, float]:
    held = [isolated_hello(path, f"llama-{n}") for n in range(11)]
    got = sum(isinstance(answer, p.Welcome) for _, answer in held)
    time.sleep(seconds)  # the bench has the victim try meanwhile
    for sock, _ in held:
        sock.close()
    return {"attacker_processes": got}


def fault_loop(path: Path, seconds: float) -> dict[str, float]:
    """npu_test.fault in a loop; a new connection whenever npud drops one (and a pause
    while its Hellos are refused, as hung_calls does)."""
    crashes = refused = dropped = hellos_refused = 0
    npu: npu_client.Client | None = None
    handle: Any = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if npu is None:
            try:
                npu = npu_client.connect(str(path), name="attacker")
            except npu_client.NotPermitted:
                hellos_refused += 1
                time.sleep(0.1)
                continue
            handle = _open(npu, TEST_URI)
        try:
            handle.invoke(5)
        except npu_client.NotPermitted as exc:
            if "refused_requests_before_drop" not in exc.message:
                refused += 1
                continue
            # npud dropped it (too many refused requests); the client says so from then on
            dropped += 1
            npu.close()
            npu = None
        except npu_client.NpuConnectionError:
            dropped += 1
            npu.close()
            npu = None
        except npu_client.NpuError:
            crashes += 1  # its DSP process died: open the skel in the new one
            handle = _open(npu, TEST_URI)
    if npu is not None:
        npu.close()
    return {
        "attacker_crashes": crashes,
        "attacker_refused": refused,
        "attacker_dropped": dropped,
        "attacker_hellos_refused": hellos_refused,
    }


def hung_calls(path: Path, seconds: float) -> dict[str, float]:
    hung = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            npu = npu_client.connect(str(path), name="attacker")
        except npu_client.NotPermitted:
            refused += 1
            time.sleep(0.1)
            continue
        try:
            _open(npu, TEST_URI).invoke(4, [struct.pack("<I", 45_000_000)])
        except npu_client.NpuError:
            hung += 1
        finally:
            npu.close()
    return {"attacker_hung": hung, "attacker_refused": refused}


Scenario = Callable[[Path, float], dict[str, float]]
"""An attack: run as the attacker's uid with npud's socket and the window's length;
returns its own figures (named ``attacker_*``)."""


def crafted_onnx(size_mib: int) -> Scenario:
    """The review's crafted ONNX file of ``size_mib`` MiB (2-byte empty nodes), loaded
    once through a memfd (only its fd travels to npud, which parses it)."""

    def attack(path: Path, seconds: float) -> dict[str, float]:
        data = tiny_fields_model(size_mib * MIB)
        fd = os.memfd_create(f"crafted-{size_mib}mib.onnx", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            del data
            with npu_client.connect(str(path), name="attacker") as npu:
                began = time.monotonic()
                refused = 0.0
                try:
                    npu.load_model(fd, name="crafted.onnx").unload()
                except npu_client.NpuError:
                    refused = 1.0
                load_s = time.monotonic() - began
                time.sleep(max(0.0, seconds - load_s))  # the window's length, as the others
        finally:
            os.close(fd)
        return {"attacker_refused": refused, "attacker_load_s": load_s}

    return attack


STRAY_FRAME: Final = 1 << 16
"""The length the stray-fds frame's header claims: it never gets that many bytes."""


def stray_fds(path: Path, seconds: float) -> dict[str, float]:
    """The review's fd flood on one connection: after its Hello, a frame header, then one
    byte of that frame at a time with ``MAX_FDS_PER_FRAME`` (4) fds on each, until npud
    drops the connection (its user's ``max_fds_waiting`` fds waiting to be closed, or the
    frame's ``frame_timeout_s``) or the frame would end; then the window's rest idle."""
    end = time.monotonic() + seconds
    sent, dropped = _stray_fds_once(path, end)
    time.sleep(max(0.0, end - time.monotonic()))
    return {"attacker_dropped": dropped, "attacker_fds_sent": sent}


def stray_fds_loop(path: Path, seconds: float) -> dict[str, float]:
    """stray_fds again on a new connection each time npud drops one, for the window
    (a pause after a refused Hello, as hung_calls does)."""
    sent = dropped = connections = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        connections += 1
        fds_sent, was_dropped = _stray_fds_once(path, end)
        sent += fds_sent
        dropped += max(was_dropped, 0)
        if was_dropped < 0:
            refused += 1
            time.sleep(0.1)
    return {
        "attacker_connections": connections,
        "attacker_dropped": dropped,
        "attacker_fds_sent": sent,
        "attacker_refused": refused,
    }


def _stray_fds_once(path: Path, end: float) -> tuple[int, int]:
    """One flooding connection: (fds sent, 1 when npud dropped it, -1 when it refused
    the Hello)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(START_TIMEOUT)
    sent = 0
    try:
        sock.connect(str(path))
        conn = p.ClientConnection()
        hello, _ = conn.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="strayfds"))
        sock.sendall(hello)
        answer = sock.recv(65536)
        if not answer:
            raise RuntimeError("npud closed the stray-fds connection before its Welcome")
        conn.receive_data(answer, [])
        if isinstance(conn.next_event(), p.ErrorMessage):
            return 0, -1  # its user was dropped too often: refused for a while
        sock.sendall(b"NP\x00\x00" + struct.pack("<I", STRAY_FRAME))
        while time.monotonic() < end and sent < STRAY_FRAME - 1:
            fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(4)]
            try:
                sock.sendmsg([b"\x80"], fds_ancillary(fds))
                sent += 1
            except OSError:  # EPIPE, ECONNRESET: npud dropped it
                return 4 * sent, 1
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        sock.close()
    return 4 * sent, 0


SCENARIOS: Final[dict[str, Scenario]] = {
    "cross_user": cross_user,
    "isolate_hog": isolate_hog,
    "fault_loop": fault_loop,
    "crafted_onnx_4mib": crafted_onnx(4),
    "crafted_onnx_8mib": crafted_onnx(8),
    "stray_fds": stray_fds,
    "stray_fds_loop": stray_fds_loop,
    "hung_calls": hung_calls,
}
"""Every attack through npud, by name, in the order they run (each as a user of its own,
bench/attacks.py's ``attacker_uids``): add yours here."""
OPTIONAL: Final[dict[str, Scenario]] = {"crafted_onnx_16mib": crafted_onnx(16)}
"""Attacks run only when asked (``--crafted-16mib``), before stray_fds: longer, and the
8 MiB one shows the same."""
ORDER: Final = [
    *[n for n in SCENARIOS if n not in ("stray_fds", "stray_fds_loop", "hung_calls")],
    *OPTIONAL,
    "stray_fds",
    "stray_fds_loop",
    "hung_calls",
]
LOCAL: Final = ("zero_stride",)
"""Attacks on the emulated DSP in the bench's own process (no daemon: npud's clients
have no dspqueue API), after the others: bench/attacks_parse.py's :func:`zero_stride`."""


def attacker_runs(scenario: Scenario, seconds: float) -> Callable[[Path, BinaryIO, BinaryIO], None]:
    def work(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
        try:
            tell(outbox, scenario(path, seconds))
        except Exception as exc:
            tell(outbox, {"error": repr(exc)})

    return work

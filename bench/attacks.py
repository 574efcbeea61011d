"""Attacks: a hostile user beside a victim user running VAD, npud as shipped (issue 27).

The review's five high findings and its critical one, each repeated as an attacker
beside a victim, in one table. npud runs on the emulator with config/npud.toml as
shipped (the two users allowed, the call watchdog at 0.5 s so a hung call ends within
the run). The victim, uid 65534 (nobody), runs the Silero VAD model every 32 ms and
holds a buffer of its own with a secret in it, mapped into its DSP process. The
attacker, uid 65533, runs each scenario in turn, each for the same time (10 s; 3 s with
--quick); before each, a quiet window of that length, the attacker's user connected and
idle (its own DSP process open, as any user's may be), is the baseline. Both are
processes forked from the bench that drop to their uid. Needs root (the two users).

Each scenario gives four rows, ``attacks.<scenario>.<what>``, with issue 27's goals:

* ``errors``: the victim's failed runs during the attack (and, for isolate_hog, its own
  isolated Hello if refused). Goal 0. The attack's own figures (``attacker_*``) are
  beside it.
* ``worst``: the victim's worst run during the attack, in ms (``quiet_worst_ms``: in the
  quiet window). Goal at most 100 ms.
* ``rss``: npud's peak resident memory attacked / quiet. Goal at most 1.1.
* ``fds``: npud's peak open fds attacked / quiet. Goal at most 1.1. Where the attack
  holds what npud grants any user within a bound, that is the attacker's own and is
  taken off the peak first (``attacker_own_fds``): for isolate_hog the fds npud held
  with its 4 DSP processes and connections up, measured; for stray_fds and
  stray_fds_loop the peak's excess over quiet up to ``attacker_fds_bound``, its
  ``max_fds_waiting`` + 4 fds waiting to be closed.
  ``npud_fds_left``: npud's fds once the attack ended and settled, over those with the
  victim alone (goal 0: it returned).

The scenarios, in order:

* ``cross_user`` (critical): the attacker's DSP code (the dspqueue skel's
  ``init_process_state``, which maps the memory an fd names) tries every fd number up
  to 512. ``attacker_reached``: other users' buffers it mapped (must be 0).
* ``isolate_hog``: 11 isolated Hellos held at once; ``attacker_processes``: DSP
  processes it got (``max_domains_per_uid``, 4); the victim's isolated Hello meanwhile
  counts as an error if refused.
* ``fault_loop``: ``npu_test.fault`` in a loop; ``attacker_crashes``: DSP processes it
  crashed (0: faults are root's), ``attacker_refused``: calls refused.
* ``crafted_onnx_4mib``, ``crafted_onnx_8mib`` (``crafted_onnx_16mib`` with
  --crafted-16mib): the review's ONNX file of 2-byte empty nodes, loaded once
  (``attacker_load_s``: its wait for the answer; ``attacker_refused``: 1 if refused).
* ``stray_fds``: after its Hello, a frame header, then one byte at a time with 4 fds
  on each, on one connection, as the review did; ``attacker_dropped``: 1 when npud
  dropped it (at ``max_fds_waiting``), ``attacker_fds_sent``; then idle.
* ``stray_fds_loop``: the same on a new connection each time npud drops one, for the
  whole window (``attacker_connections``).
* ``hung_calls`` (last: its user is refused for a minute after): 45 s calls, each on a
  fresh connection; ``attacker_hung``: calls the watchdog ended, ``attacker_refused``:
  Hellos refused (its user is revoked after ``hung_calls_before_revoke``, 2).
* ``zero_stride``: an htp CPY batch of 2^29 f32 elements of stride 0 over 4 bytes in
  one emulated DSP process, beside a victim htp session (a SCALE batch every 32 ms) in
  another. It runs in the bench's own process on the emulator (npud's clients have no
  dspqueue API), so "npud" there is the driver's side; ``attacker_status`` (4:
  INVAL_PARAMS), ``attacker_dsp_alive``, ``attacker_dsp_peak_rss_mib``.

Another attack through npud is one more function ``(socket path, seconds) -> figures``
run as the attacker, and one more entry in :data:`SCENARIOS`.

Run: ``python -m bench --only attacks`` (every scenario but the 16 MiB file), or
``python -m bench.attacks [--only SCENARIO,...] [--crafted-16mib] [--seconds S]
[--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import npu_client
import npu_protocol as p
from bench.attacks_parse import MIB, Outcome, tiny_fields_model, zero_stride
from bench.harness import REPO_ROOT, Context, Goal, Row, format_table, ratio_row
from bench.processes import START_TIMEOUT, running, wait_for_hello
from npu_client.transport import fds_ancillary, recv_message, send_message

NAME = "attacks"
SUMMARY = "an attacker uid beside a victim uid running VAD: errors, worst latency, npud's RSS/fds"

VICTIM: Final = 65534
ATTACKER: Final = 65533
WATCHDOG_S: Final = 0.5
PERIOD_S: Final = 0.032
SECRET: Final = b"SECRET-of-the-victim-0123456789a" * 2
TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DSPQUEUE_URI: Final = (
    "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0"
    "&_dom=cdsp&_session=0"
)
SCAN_FDS: Final = 512
ENOSUCHMAP: Final = 0x80000441 & 0xFFFFFFFF


def _shipped_config() -> str:
    """config/npud.toml as shipped, on the emulator, with the two users allowed."""
    text = (REPO_ROOT / "config" / "npud.toml").read_text()
    for old, new in {
        'kind = "auto"': 'kind = "emulator"',
        'socket_mode = "0660"': 'socket_mode = "0666"',
        'log_level = "info"': 'log_level = "warning"',
        "call_watchdog_s = 30.0": f"call_watchdog_s = {WATCHDOG_S}",
        "allow_uids = []": f"allow_uids = [{VICTIM}, {ATTACKER}]",
    }.items():
        if old not in text:
            raise RuntimeError(f"config/npud.toml no longer has {old!r}")
        text = text.replace(old, new)
    return text


# --- processes of other users ------------------------------------------------------------


@dataclass
class Forked:
    """A child running as another user; lines of JSON to and from it."""

    pid: int
    to_child: BinaryIO
    from_child: BinaryIO

    def say(self, line: str) -> None:
        self.to_child.write(line.encode() + b"\n")
        self.to_child.flush()

    def hear(self) -> Any:
        line = self.from_child.readline()
        if not line:
            raise RuntimeError("a child of the attack bench ended without an answer")
        return json.loads(line)


@contextlib.contextmanager
def as_user(
    uid: int, socket_path: Path, work: Callable[[Path, BinaryIO, BinaryIO], None]
) -> Iterator[Forked]:
    """``work(socket, from parent, to parent)`` in a forked child running as ``uid``; the
    socket's directory is reached through an fd (its parents' modes do not matter)."""
    directory = os.open(socket_path.parent, os.O_PATH)
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(down_w)
            os.close(up_r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            path = Path(f"/proc/self/fd/{directory}/{socket_path.name}")
            with open(down_r, "rb") as inbox, open(up_w, "wb") as outbox:
                work(path, inbox, outbox)
        except BaseException:
            traceback.print_exc()  # the parent hears of it as a child that ended unasked
            sys.stderr.flush()
            code = 1
        finally:
            os._exit(code)
    os.close(directory)
    os.close(down_r)
    os.close(up_w)
    child = Forked(pid, open(down_w, "wb"), open(up_r, "rb"))  # noqa: SIM115 - closed below
    try:
        yield child
    finally:
        child.to_child.close()
        child.from_child.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _tell(outbox: BinaryIO, value: object) -> None:
    outbox.write(json.dumps(value).encode() + b"\n")
    outbox.flush()


# --- the victim ----------------------------------------------------------------------------


def _preload(socket_path: Path, model: BinaryIO) -> None:
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


def _victim(model: BinaryIO) -> Callable[[Path, BinaryIO, BinaryIO], None]:
    def work(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
        import numpy as np  # noqa: PLC0415 - imported by _preload already

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
        _tell(outbox, "ready")
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
        _tell(outbox, runs)

    return work


def _isolated_hello(path: Path, name: str) -> tuple[socket.socket, p.Welcome | p.ErrorMessage]:
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


def _victim_isolates(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
    sock, answer = _isolated_hello(path, "llama-victim")
    sock.close()
    _tell(outbox, isinstance(answer, p.Welcome))


# --- the scenarios (run as the attacker) ---------------------------------------------------


def _idle(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
    """The attacker's user connected and doing nothing: part of the quiet baseline (a
    user's first connection opens its DSP process, which any user may)."""
    with npu_client.connect(str(path), name="attacker-idle"):
        _tell(outbox, "connected")
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
    held = [_isolated_hello(path, f"llama-{n}") for n in range(11)]
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
"""Every attack through npud, by name, in the order they run: add yours here, before
hung_calls (which gets the attacker's user refused for a minute: it runs last)."""
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


def _attacker(scenario: Scenario, seconds: float) -> Callable[[Path, BinaryIO, BinaryIO], None]:
    def work(path: Path, inbox: BinaryIO, outbox: BinaryIO) -> None:
        try:
            _tell(outbox, scenario(path, seconds))
        except Exception as exc:
            _tell(outbox, {"error": repr(exc)})

    return work


# --- npud's footprint -------------------------------------------------------------------


class Sampler:
    """npud's peak RSS and fd count, sampled every 20 ms while a window lasts."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = 0
        self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attacks-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss = max(self.rss, int(line.split()[1]) * 1024)
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            if self._stop.wait(0.02):
                return


def _max_fds_waiting() -> int:
    """``[uid_limits] max_fds_waiting`` as shipped: the fds of one user npud may hold
    waiting to be closed."""
    value = tomllib.loads(_shipped_config())["uid_limits"]["max_fds_waiting"]
    assert isinstance(value, int)
    return value


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settle(pid: int, fds: int, timeout: float = 15.0) -> None:
    """Wait until npud holds no more fds than with the victim alone: the last attack's
    connections and DSP processes are gone before the next quiet window."""
    deadline = time.monotonic() + timeout
    while _fds(pid) > fds and time.monotonic() < deadline:
        time.sleep(0.05)


# --- the module -------------------------------------------------------------------------


def rows(ctx: Context) -> list[Row]:
    """Every scenario of :data:`SCENARIOS` and :data:`LOCAL` (``python -m bench``)."""
    return run(ctx, [*SCENARIOS, *LOCAL])


def run(ctx: Context, names: list[str], seconds: float | None = None) -> list[Row]:
    """The scenarios ``names`` (of SCENARIOS, OPTIONAL and LOCAL), each ``seconds`` long
    (default 10, 3 with ``--quick``) after as long a quiet window."""
    if os.geteuid() != 0:
        raise RuntimeError("the attacks bench needs root: it runs clients as two other users")
    if seconds is None:
        seconds = 3.0 if ctx.quick else 10.0
    through_npud = {**SCENARIOS, **OPTIONAL}
    chosen = {n: through_npud[n] for n in ORDER if n in names}
    found = _through_npud(ctx, chosen, seconds)
    if "zero_stride" in names:
        ctx.progress("attacks: zero_stride, on the emulator in this process")
        found += _zero_stride_rows(zero_stride(settle_s=seconds / 2))
    return found


def _through_npud(  # noqa: PLR0915 - the windows, step by step
    ctx: Context, chosen: dict[str, Scenario], seconds: float
) -> list[Row]:
    if not chosen:
        return []
    from bench.model_vad import SILERO  # noqa: PLC0415 - numpy and the model, when it runs

    workdir = ctx.workdir / "attacks"
    workdir.mkdir(exist_ok=True)
    workdir.chmod(0o711)
    config = workdir / "npud.toml"
    config.write_text(_shipped_config())
    socket_path = workdir / "npud.sock"
    args = [
        sys.executable, "-m", "npud.daemon.main", "--config", str(config),
        "--socket", str(socket_path), "--log-format", "json",
    ]  # fmt: skip
    found: list[Row] = []
    with (
        running(args, stderr=workdir / "npud.log") as daemon,
        open(SILERO, "rb") as model,
    ):
        wait_for_hello(daemon, socket_path)
        _preload(socket_path, model)
        with as_user(VICTIM, socket_path, _victim(model)) as victim:
            if victim.hear() != "ready":
                raise RuntimeError("the victim did not start")
            windows: list[tuple[str, float, float, float, dict[str, float]]] = []
            settled = _fds(daemon.pid)
            for name, scenario in chosen.items():
                ctx.progress(f"attacks: {name}, quiet then attacked, {seconds:g} s each")
                _settle(daemon.pid, settled)
                with as_user(ATTACKER, socket_path, _idle) as idle:
                    idle.hear()  # connected: the quiet window has the attacker's user in
                    with Sampler(daemon.pid) as quiet:
                        quiet_start = time.monotonic()
                        time.sleep(seconds)
                    idle.say("go")
                _settle(daemon.pid, settled)
                attack_start = time.monotonic()
                own = 0
                with (
                    Sampler(daemon.pid) as attacked,
                    as_user(ATTACKER, socket_path, _attacker(scenario, seconds)) as attacker,
                ):
                    extra = 0.0
                    if name == "isolate_hog":
                        time.sleep(seconds / 2)
                        own = _fds(daemon.pid)  # the attacker's, held: less npud's below
                        with as_user(VICTIM, socket_path, _victim_isolates) as trying:
                            extra = 0.0 if trying.hear() else 1.0
                    figures = attacker.hear()
                attack_end = time.monotonic()
                if "error" in figures:
                    raise RuntimeError(f"attacks: {name}: {figures['error']}")
                _settle(daemon.pid, settled)
                after = _fds(daemon.pid)
                figures.update(
                    victim_isolate_refused=extra,
                    npud_rss_mib=attacked.rss / (1 << 20),
                    quiet_rss_mib=quiet.rss / (1 << 20),
                    npud_fds=attacked.fds,
                    quiet_fds=quiet.fds,
                    npud_fds_left=after - settled,
                )
                if own:
                    figures["attacker_own_fds"] = own - after
                if name.startswith("stray_fds"):
                    # What npud may hold for it: its fds waiting to be closed, up to their
                    # bound (the peak over quiet, if less: the sampler may miss a spike).
                    bound = _max_fds_waiting() + p.MAX_FDS_PER_FRAME
                    figures["attacker_fds_bound"] = bound
                    figures["attacker_own_fds"] = min(bound, max(0, attacked.fds - quiet.fds))
                windows.append((name, quiet_start, attack_start, attack_end, figures))
            victim.say("stop")
            runs: list[list[Any]] = victim.hear()
    for name, quiet_start, attack_start, attack_end, figures in windows:
        found += _scenario_rows(name, runs, quiet_start, attack_start, attack_end, figures)
    return found


def _scenario_rows(
    name: str,
    runs: list[list[Any]],
    quiet_start: float,
    attack_start: float,
    attack_end: float,
    figures: dict[str, float],
) -> list[Row]:
    quiet = [r for r in runs if quiet_start <= r[0] < attack_start]
    attacked = [r for r in runs if attack_start <= r[0] < attack_end]
    errors = sum(not ok for _, _, ok in attacked) + figures.pop("victim_isolate_refused", 0.0)
    worst_ms = max((seconds * 1000 for _, seconds, _ in attacked), default=float("nan"))
    quiet_worst_ms = max((seconds * 1000 for _, seconds, _ in quiet), default=float("nan"))
    apart = ("attacker_own_fds", "attacker_fds_bound")  # the fds row's
    attack = {k: v for k, v in figures.items() if k.startswith("attacker_") and k not in apart}
    own = figures.get("attacker_own_fds", 0.0)
    fds_figures = {
        "npud_fds": figures["npud_fds"],
        "quiet_fds": figures["quiet_fds"],
        "npud_fds_left": figures["npud_fds_left"],
    }
    fds_figures.update({k: figures[k] for k in apart if k in figures})
    return _rows(
        f"attacks.{name}",
        errors=errors,
        victim={"victim_runs": len(attacked), **attack},
        worst_ms=worst_ms,
        quiet_worst_ms=quiet_worst_ms,
        rss=(figures["npud_rss_mib"], figures["quiet_rss_mib"]),
        fds=((figures["npud_fds"] - own) / figures["quiet_fds"], fds_figures),
        fds_what=(
            "npud's peak fds attacked, less the attacker's own within its bound "
            "(attacker_own_fds), / quiet"
            if "attacker_own_fds" in figures
            else "npud's peak fds attacked / quiet"
        ),
    )


def _rows(
    prefix: str,
    *,
    errors: float,
    victim: dict[str, float],
    worst_ms: float,
    quiet_worst_ms: float,
    rss: tuple[float, float],
    fds: tuple[float, dict[str, float]],
    fds_what: str = "npud's peak fds attacked / quiet",
) -> list[Row]:
    """The four rows of one scenario, with the goals of issue 27."""
    return [
        ratio_row(
            f"{prefix}.errors",
            "the victim's failed runs during the attack (count)",
            [errors],
            victim,
            Goal("ratio", 0),
        ),
        ratio_row(
            f"{prefix}.worst",
            "the victim's worst run during the attack (ms)",
            [worst_ms],
            {"quiet_worst_ms": quiet_worst_ms},
            Goal("ratio", 100),
        ),
        ratio_row(
            f"{prefix}.rss",
            "npud's peak RSS attacked / quiet",
            [rss[0] / rss[1]],
            {"npud_rss_mib": rss[0], "quiet_rss_mib": rss[1]},
            Goal("ratio", 1.1),
        ),
        ratio_row(f"{prefix}.fds", fds_what, [fds[0]], fds[1], Goal("ratio", 1.1)),
    ]


def _zero_stride_rows(outcome: Outcome) -> list[Row]:
    """zero_stride's rows: "npud" is the bench's process here (the driver's side)."""
    quiet_worst_ms = outcome.details.pop("quiet_worst_ms")
    return _rows(
        "attacks.zero_stride",
        errors=outcome.victim_errors,
        victim={
            "victim_runs": outcome.victim_runs,
            "attacker_batch_s": outcome.load_s,
            **outcome.details,
        },
        worst_ms=outcome.victim_worst_ms,
        quiet_worst_ms=quiet_worst_ms,
        rss=(outcome.peak_rss_mib, outcome.rss_before_mib),
        fds=(
            outcome.peak_fds / outcome.fds_before,
            {"npud_fds": outcome.peak_fds, "quiet_fds": outcome.fds_before},
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attacks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    every = [*ORDER, *LOCAL]
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SCENARIO",
        help=f"run only these (repeat or comma-separate): {', '.join(every)}",
    )
    parser.add_argument(
        "--crafted-16mib",
        action="store_true",
        help="also crafted_onnx_16mib (the review's largest file)",
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="each window's length (default 10; --quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="3 s windows: a smoke run")
    args = parser.parse_args(argv)
    names = [n for item in args.only for n in item.split(",") if n] or [*SCENARIOS, *LOCAL]
    if args.crafted_16mib:
        names.append("crafted_onnx_16mib")
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(every)}")
    with tempfile.TemporaryDirectory(prefix="npud-attacks-") as tmp:
        found = run(Context(quick=args.quick, workdir=Path(tmp)), names, args.seconds)
    print(format_table(found, quick=args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Each emulated DSP process (PD) runs its skels in a child process of its own.

What the issue asks, checked on the emulator itself: the child is unprivileged and
confined, a looping model or a hung skel burns only its child while other PDs keep
serving, ending a PD (exit, restart, its fd's release) kills its child and answers
the calls waiting on it at once, a child that dies on its own is a crash of its PD,
and nothing is left behind. No timing is asserted: "at once" means the call returns
while the work it started would still run for minutes (the hang guard is a minute).
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from npu_protocol import AEE, ErrorCode
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import PORTAL_QNN_URI
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.pd_host import live_zygotes
from tests.emulator import onnx_models, probe_skel
from tests.emulator.conftest import ECHO_URI, TEST_URI
from tests.emulator.sim_helpers import (
    AEE_EBADSTATE,
    ReverseResponder,
    call,
    exit_process,
    init_create,
    open_skel,
)
from tests.polling import wait_until

SC_ECHO: Final = 0x02020100
SC_BUSY: Final = 0x04010000
HANG_GUARD: Final = 60.0
"""Seconds after which a call that should have returned at once fails the test."""
FOREVER_US: Final = 0xFFFFFFFF  # npu_test.busy: an hour and more
PORTAL: Final = idl.load("portal_qnn")
ROOT: Final = os.geteuid() == 0


# -- helpers ---------------------------------------------------------------------------------


def _library(tmp_path: Path) -> Path:
    directory = tmp_path / "dsp"
    directory.mkdir(exist_ok=True)
    probe_skel.write_descriptor(directory)
    for library in DSP_LIBRARY_DIR.iterdir():
        (directory / library.name).write_bytes(library.read_bytes())
    return directory


@pytest.fixture(params=["process"])
def driver(request: pytest.FixtureRequest) -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver(SimConfig(skels=probe_skel.PROBE_SKELS, pd_isolation=request.param))
    yield driver
    driver.shutdown()
    assert driver.statistics().pd_children == 0


both_isolations = pytest.mark.parametrize("driver", ["process", "thread"], indirect=True)


def _open(driver: EmulatedDriver, tmp_path: Path) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=(_library(tmp_path),))
    session.load_shell(DEV_SHELL.read_bytes())
    return session


@pytest.fixture
def session(driver: EmulatedDriver, tmp_path: Path) -> Iterator[FastRpcSession]:
    session = _open(driver, tmp_path)
    yield session
    session.close()


def _fd(session: FastRpcSession) -> int:
    return session.fileno()


def _child(driver: EmulatedDriver, session: FastRpcSession) -> int:
    pid = driver.pd_pid(_fd(session))
    assert pid is not None
    return pid


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (killed children are reaped by their zygote)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], HANG_GUARD)[0])
    finally:
        os.close(fd)


def _exists(pid: int) -> bool:
    try:
        os.close(os.pidfd_open(pid))
    except ProcessLookupError:
        return False
    return True


def _echo(session: FastRpcSession, handle: int, data: bytes) -> bytes:
    prim = Inline(struct.pack("<II", len(data), len(data)))
    result = session.invoke(handle, SC_ECHO, [prim, Inline(data)], [Capacity(len(data))])
    assert result.rc == 0
    assert result.outputs[0] is not None
    return result.outputs[0]


def _probe(session: FastRpcSession, handle: int, sc: int, data: bytes = b"", out: int = 0) -> bytes:
    inputs = [Inline(data)] if data else []
    outputs = [Capacity(out)] if out else []
    result = session.invoke(handle, sc, inputs, outputs)
    assert result.rc == 0, f"probe {sc:#x} returned {result.rc:#x}"
    if not out:
        return b""
    assert result.outputs[0] is not None
    return result.outputs[0]


def _identity(session: FastRpcSession, handle: int) -> tuple[int, int, int, int, int]:
    data = _probe(session, handle, probe_skel.SC_IDENTITY, out=probe_skel.IDENTITY.size)
    pid, uid, gid, listing, creating = probe_skel.IDENTITY.unpack(data)
    return pid, uid, gid, listing, creating


class Background:
    """A call on a thread of its own, its outcome kept."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(function,), daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], object]) -> None:
        try:
            self.result = function()
        except BaseException as exc:  # kept for the test to look at
            self.error = exc

    def join(self) -> None:
        self._thread.join(HANG_GUARD)
        assert not self._thread.is_alive(), "the call did not return"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def _rc(outcome: Background) -> int:
    assert outcome.error is None, outcome.error
    return int(getattr(outcome.result, "rc", -1))


def _restarted(outcome: Background) -> None:
    """The call met its DSP process's crash: the session, having seen the process end on
    its own, answers as after a restart."""
    assert isinstance(outcome.error, RpcError), outcome.error
    assert outcome.error.code is ErrorCode.DSP_RESTARTED


def _invoke_restarted(session: FastRpcSession, handle: int, sc: int, inputs: list[Inline]) -> None:
    with pytest.raises(RpcError) as caught:
        session.invoke(handle, sc, inputs, [Capacity(1)] if inputs else [])
    assert caught.value.code is ErrorCode.DSP_RESTARTED


def _busy_forever(session: FastRpcSession, handle: int) -> Background:
    return Background(
        lambda: session.invoke(handle, SC_BUSY, [Inline(struct.pack("<I", FOREVER_US))], [])
    )


def _spin_forever(session: FastRpcSession, handle: int) -> Background:
    return Background(
        lambda: session.invoke(handle, probe_skel.SC_SPIN, [Inline(struct.pack("<I", 0))], [])
    )


# -- one process per PD -------------------------------------------------------------------------


def test_each_pd_has_its_own_child(driver: EmulatedDriver, tmp_path: Path) -> None:
    first, second = _open(driver, tmp_path), _open(driver, tmp_path)
    try:
        pids = {_child(driver, first), _child(driver, second)}
        assert len(pids) == 2
        assert os.getpid() not in pids
        zygotes = {int(_status(pid)["PPid"]) for pid in pids}
        assert len(zygotes) == 1
        assert zygotes <= set(live_zygotes())
        stats = driver.statistics()
        assert (stats.dsp_processes, stats.pd_children) == (2, 2)
        handle = first.remote_open(probe_skel.URI)
        assert _identity(first, handle)[0] == _child(driver, first)  # the skel runs there
    finally:
        first.close()
        second.close()
    assert all(_gone(pid) for pid in pids)
    assert driver.statistics().pd_children == 0


@pytest.mark.parametrize("driver", ["thread"], indirect=True)
def test_thread_isolation_runs_skels_in_npuds_process(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(probe_skel.URI)
    assert _identity(session, handle)[0] == os.getpid()
    assert driver.pd_pid(_fd(session)) is None
    assert driver.statistics().pd_children == 0


def test_the_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="pd_isolation"):
        SimConfig(pd_isolation="fork")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pd_user"):
        SimConfig(pd_user="")
    if ROOT:  # the user only matters to a driver that runs as root
        for user, reason in [("root", "is root"), ("no-such-user-here", "no such user")]:
            with pytest.raises(ValueError, match=reason):
                EmulatedDriver(SimConfig(pd_user=user))


# -- the child is unprivileged and confined ------------------------------------------------------


def test_the_child_holds_no_privilege(driver: EmulatedDriver, session: FastRpcSession) -> None:
    status = _status(_child(driver, session))
    uid = 65534 if ROOT else os.getuid()  # the dedicated user is "nobody" by default
    assert status["Uid"].split() == [str(uid)] * 4
    if ROOT:
        assert status["Gid"].split() == [str(status["Gid"].split()[0])] * 4
        assert status["Groups"] == ""
        assert int(status["CapBnd"], 16) == 0
    for capability in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[capability], 16) == 0, capability
    assert status["NoNewPrivs"] == "1"


def test_the_child_has_an_empty_directory_and_only_its_sockets(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    pid = _child(driver, session)
    handle = session.remote_open(probe_skel.URI)
    _, uid, _, listing, creating = _identity(session, handle)
    assert listing == errno.EACCES
    assert creating in (errno.EACCES, errno.ENOENT)  # not writable, and deleted besides
    assert uid == int(_status(pid)["Uid"].split()[0])
    # An empty directory npud made (mode 0111) and removed once the zygote was in it.
    assert os.readlink(f"/proc/{pid}/cwd").endswith(" (deleted)")
    cwd = os.stat(f"/proc/{pid}/cwd")
    assert stat.S_IMODE(cwd.st_mode) == 0o111
    assert cwd.st_uid == os.getuid()
    assert cwd.st_nlink == 0 or not os.listdir(f"/proc/{pid}/cwd")
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert fds.pop(0) == "/dev/null"
    fds.pop(1, None)
    fds.pop(2, None)  # npud's stderr, where a child's last words go
    assert sorted(fds.values()) == [
        "socket:" + target.split(":", 1)[1] for target in sorted(fds.values())
    ]
    assert len(fds) == 2  # its socket and its doorbell


def _others_may_read(path: Path) -> bool:
    """Whether a user other than the owner (nor in its group) may read ``path``."""
    if not path.stat().st_mode & stat.S_IROTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)


def _sandbox() -> str:
    from npud.sim.pd_host import _POOL

    return " ".join(zygote.sandbox for zygote in _POOL.zygotes())


def test_the_child_cannot_open_npuds_files(session: FastRpcSession, tmp_path: Path) -> None:
    private = tmp_path / "etc-npud"
    private.mkdir(mode=0o700)
    key = private / "npud.key"
    key.write_bytes(b"secret")
    key.chmod(0o600)
    world_readable = tmp_path / "npud.toml"
    world_readable.write_text("[npud]\n")
    world_readable.chmod(0o644)
    tmp_path.chmod(0o755)
    handle = session.remote_open(probe_skel.URI)

    def opening(path: Path) -> int:
        data = _probe(session, handle, probe_skel.SC_OPEN, str(path).encode(), 4)
        return int(struct.unpack("<i", data)[0])

    assert opening(key) == errno.EACCES
    if "Landlock" in _sandbox():  # even a file every user may read is out of reach
        assert opening(world_readable) == errno.EACCES
    # Python code stays readable where other users may read it; a child needs none of
    # it, though: it imported all it runs before it confined itself (issue 27).
    code = Path(abi.__file__)
    assert opening(code) == (0 if os.geteuid() != 0 or _others_may_read(code) else errno.EACCES)
    killing = _probe(session, handle, probe_skel.SC_SIGNAL, struct.pack("<I", os.getpid()), 4)
    assert struct.unpack("<i", killing) == (errno.EPERM,)  # npud is out of its reach


# -- concurrency ------------------------------------------------------------------------------------


@both_isolations
def test_calls_on_one_pd_run_at_once(driver: EmulatedDriver, session: FastRpcSession) -> None:
    handle = session.remote_open(TEST_URI)
    calls = [_busy_forever(session, handle) for _ in range(3)]
    # Three calls on the DSP together (the listener's next2 is the fourth).
    wait_until(
        lambda: driver.statistics().invokes_in_flight >= 4,
        "three busy calls at once",
        timeout=HANG_GUARD,
    )
    pid = driver.pd_pid(_fd(session))
    if pid is not None:
        wait_until(
            lambda: int(_status(pid)["Threads"]) >= 4,
            "three threads in the child",
            timeout=HANG_GUARD,
        )
    session.end_process()  # the busy calls end with their process
    for busy in calls:
        busy.join()
        assert _rc(busy) == AEE.EBADSTATE.dsp


@both_isolations
def test_many_calls_at_once_on_one_pd(driver: EmulatedDriver, session: FastRpcSession) -> None:
    """Calls that ask npud for work, calls that do not, large and small payloads and
    buffers coming and going, from eight threads at once: every answer is right."""
    echo_handle = session.remote_open(ECHO_URI)
    test_handle = session.remote_open(TEST_URI)
    failures: list[str] = []

    def client(number: int) -> None:
        try:
            for index in range(25):
                data = bytes([number, index]) * (40_000 if index % 5 == 0 else 8)
                if _echo(session, echo_handle, data) != data:
                    failures.append(f"echo {number}/{index}")
                prim = Inline(struct.pack("<I", 1000))
                if session.invoke(test_handle, SC_BUSY, [prim], []).rc != 0:
                    failures.append(f"busy {number}/{index}")
                buffer = session.alloc(2 * 4096)
                try:
                    buffer.view()[:4] = bytes([number, index, 7, 7])
                    result = session.invoke(
                        echo_handle,
                        SC_ECHO,
                        [Inline(struct.pack("<II", 4, 4)), Slice(buffer, 0, 4)],
                        [Slice(buffer, 4096, 4)],
                    )
                    if result.rc != 0 or bytes(buffer.view()[4096:4100]) != bytes(
                        [number, index, 7, 7]
                    ):
                        failures.append(f"slice {number}/{index}")
                finally:
                    session.free(buffer)  # the child drops it while others run
        except Exception as exc:  # reported below
            failures.append(f"client {number}: {exc!r}")

    clients = [Background(lambda n=n: client(n)) for n in range(8)]  # type: ignore[misc]
    for background in clients:
        background.join()
    assert failures == []


def _portal_call(session: FastRpcSession, handle: int, name: str, **arguments: object) -> int:
    method = PORTAL.method(name)
    encoded = method.encode(**arguments)
    inputs = [Inline(x) for x in encoded.inputs if isinstance(x, bytes)]
    outputs = [Capacity(x) for x in encoded.outputs if isinstance(x, int)]
    return session.invoke(handle, encoded.sc, inputs, outputs).rc


def test_a_looping_model_burns_only_its_child(driver: EmulatedDriver, tmp_path: Path) -> None:
    looping, other = _open(driver, tmp_path), _open(driver, tmp_path)
    try:
        portal = looping.remote_open(PORTAL_QNN_URI)
        with (
            onnx_models.opened(tmp_path, "loop.onnx", onnx_models.endless_loop()) as fd,
            looping.expose_file(fd, suffix=".onnx") as exposed,
        ):
            assert _portal_call(looping, portal, "model_load", model_uri=exposed.name) == 0
        assert (
            _portal_call(
                looping,
                portal,
                "set_input",
                model_index=0,
                graph_index=0,
                tensor_index=0,
                data=bytes(4),
            )
            == 0
        )
        child = _child(driver, looping)
        run = Background(
            lambda: _portal_call(looping, portal, "execute", model_index=0, graph_index=0)
        )
        wait_until(
            lambda: _cpu_ticks(child) > 20, "the loop burning its child's CPU", timeout=HANG_GUARD
        )
        npud_cpu = time.process_time()
        handle = other.remote_open(ECHO_URI)
        for index in range(50):  # another PD serves meanwhile
            assert _echo(other, handle, b"%d" % index) == b"%d" % index
        assert run.running
        # Not this process: the loop's CPU is its child's (npud spent what the echoes cost).
        assert time.process_time() - npud_cpu < (_cpu_ticks(child) / os.sysconf("SC_CLK_TCK"))
        # Closing the session as the daemon does: busy at first (the run is on the DSP),
        # then it ends the process, whose run returns at once, and closes.
        with pytest.raises(RpcError) as busy:
            looping.close(timeout=0.1)
        assert busy.value.code is ErrorCode.SESSION_BUSY
        looping.end_process()
        run.join()
        assert run.error is None
        assert run.result == AEE.EBADSTATE.dsp
        assert _gone(child)
        looping.close()
        assert driver.statistics().pd_children == 1
        assert _echo(other, handle, b"still") == b"still"
    finally:
        looping.close()
        other.close()


def test_a_hung_skel_burns_only_its_child(
    driver: EmulatedDriver, session: FastRpcSession, tmp_path: Path
) -> None:
    handle = session.remote_open(probe_skel.URI)
    child = _child(driver, session)
    hung = _spin_forever(session, handle)
    wait_until(lambda: _cpu_ticks(child) > 20, "the skel spinning", timeout=HANG_GUARD)
    other = _open(driver, tmp_path)
    try:
        assert _echo(other, other.remote_open(ECHO_URI), b"served") == b"served"
        # The same PD serves other calls beside the hung one, on another thread of its child.
        second = session.remote_open(ECHO_URI)
        assert _echo(session, second, b"beside") == b"beside"
    finally:
        other.close()
    session.end_process()
    hung.join()
    assert _rc(hung) == AEE.EBADSTATE.dsp
    assert _gone(child)


def _raw_process(driver: EmulatedDriver, tmp_path: Path) -> tuple[int, ReverseResponder]:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    return fd, ReverseResponder(driver, fd, _library(tmp_path)).start()


def _raw_spin(driver: EmulatedDriver, fd: int, handle: int) -> Background:
    return Background(
        lambda: call(driver, fd, handle, probe_skel.SC_SPIN, [struct.pack("<I", 0)], [])[0]
    )


def test_exit_then_close_of_a_pd_whose_call_hangs(driver: EmulatedDriver, tmp_path: Path) -> None:
    fd, responder = _raw_process(driver, tmp_path)
    try:
        handle = open_skel(driver, fd, probe_skel.URI)
        child = driver.pd_pid(fd)
        assert child is not None
        spin = _raw_spin(driver, fd, handle)
        wait_until(lambda: _cpu_ticks(child) > 20, "the skel spinning", timeout=HANG_GUARD)
        assert exit_process(driver, fd) == 0
        spin.join()
        assert spin.result == AEE_EBADSTATE
        assert _gone(child)
        responder.join()
        assert responder.exit_result == AEE_EBADSTATE
    finally:
        driver.close(fd)
    assert driver.statistics().pd_children == 0


def test_close_with_a_call_in_flight_defers_the_release_like_the_kernel(
    driver: EmulatedDriver, tmp_path: Path
) -> None:
    """close() cannot release a file another thread is inside an ioctl of: the PD (and
    its child) lives on until the call returns; a restart ends it."""
    fd, responder = _raw_process(driver, tmp_path)
    handle = open_skel(driver, fd, probe_skel.URI)
    child = driver.pd_pid(fd)
    assert child is not None
    spin = _raw_spin(driver, fd, handle)
    wait_until(lambda: _cpu_ticks(child) > 20, "the skel spinning", timeout=HANG_GUARD)
    driver.close(fd)
    assert driver.statistics().releases_pending == 1
    assert _exists(child)
    driver.faults.subsystem_restart(down_for=0)
    spin.join()
    assert isinstance(spin.error, OSError)
    assert spin.error.errno == errno.EPIPE
    responder.join()
    assert _gone(child)
    stats = driver.statistics()
    assert (stats.releases_pending, stats.pd_children, stats.dsp_processes) == (0, 0, 0)


@both_isolations
def test_a_restart_ends_the_calls_in_the_child_with_epipe(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(TEST_URI)
    busy = _busy_forever(session, handle)
    wait_until(
        lambda: driver.statistics().invokes_in_flight >= 2,
        "the busy call on the DSP",
        timeout=HANG_GUARD,
    )
    child = driver.pd_pid(_fd(session))
    driver.faults.subsystem_restart(down_for=0)
    busy.join()
    assert isinstance(busy.error, RpcError), busy.error
    assert session.dead
    if child is not None:
        assert _gone(child)


# -- crashes ----------------------------------------------------------------------------------------


@both_isolations
def test_a_crash_mid_call_ends_the_pd(driver: EmulatedDriver, session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    child = driver.pd_pid(_fd(session))
    driver.faults.crash_next_invoke()
    prim = Inline(struct.pack("<II", 1, 1))
    _invoke_restarted(session, handle, SC_ECHO, [prim, Inline(b"x")])
    assert session.dead
    _invoke_restarted(session, handle, SC_ECHO, [prim, Inline(b"x")])
    wait_until(lambda: not session.listener_running, "the listener stopping", timeout=HANG_GUARD)
    stats = driver.statistics()
    assert (stats.pd_crashes, stats.dsp_processes, stats.pd_children) == (1, 0, 0)
    if child is not None:
        assert _gone(child)


@both_isolations
def test_crash_process_answers_waiting_calls(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(TEST_URI)
    busy = _busy_forever(session, handle)
    wait_until(
        lambda: driver.statistics().invokes_in_flight >= 2,
        "the busy call on the DSP",
        timeout=HANG_GUARD,
    )
    assert driver.crash_process(_fd(session))
    busy.join()
    _restarted(busy)
    assert not driver.crash_process(_fd(session))  # no live process any more
    assert driver.statistics().pd_crashes == 1


def test_a_child_killed_from_outside_is_a_crash(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    child = _child(driver, session)
    os.kill(child, 9)
    assert _gone(child)
    assert driver.statistics().pd_children == 0  # noticed, and the PD crashed
    prim = Inline(struct.pack("<II", 1, 1))
    _invoke_restarted(session, handle, SC_ECHO, [prim, Inline(b"x")])
    assert driver.statistics().pd_crashes == 1


def test_a_child_killed_under_a_working_call(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    """The call waits on DSP work in npud, no one reads the child's socket: the work
    itself notices the child is gone."""
    handle = session.remote_open(TEST_URI)
    child = _child(driver, session)
    busy = _busy_forever(session, handle)
    wait_until(
        lambda: driver.statistics().invokes_in_flight >= 2,
        "the busy call on the DSP",
        timeout=HANG_GUARD,
    )
    os.kill(child, 9)
    busy.join()
    _restarted(busy)
    assert driver.statistics().pd_crashes == 1


def test_a_skel_that_raises_crashes_its_pd(
    driver: EmulatedDriver, session: FastRpcSession, caplog: pytest.LogCaptureFixture
) -> None:
    handle = session.remote_open(probe_skel.URI)
    child = _child(driver, session)
    _invoke_restarted(session, handle, probe_skel.SC_RAISE, [])
    assert _gone(child)
    assert any(
        "the probe skel was asked to raise" in record.getMessage() for record in caplog.records
    )
    assert driver.statistics().pd_crashes == 1


@both_isolations
def test_the_test_skels_fault_crashes_its_pd_alone(
    driver: EmulatedDriver, session: FastRpcSession, tmp_path: Path
) -> None:
    other = _open(driver, tmp_path)
    try:
        echo = other.remote_open(ECHO_URI)
        handle = session.remote_open(TEST_URI)
        fault = idl.load("npu_test").method("fault").sc
        with pytest.raises(RpcError) as caught:  # the session saw its DSP process end
            session.invoke(handle, fault, [], [])
        assert caught.value.code is ErrorCode.DSP_RESTARTED
        assert session.dead
        assert driver.statistics().pd_crashes == 1
        prim = Inline(struct.pack("<II", 1, 1))
        assert other.invoke(echo, SC_ECHO, [prim, Inline(b"x")], [Capacity(1)]).rc == 0
    finally:
        other.close()


def test_crash_process_without_a_process(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert not driver.crash_process(fd)
        assert not driver.crash_process(-1)
    finally:
        driver.close(fd)


# -- how buffers reach the child -------------------------------------------------------------------


def _maps_of(pid: int, name: str) -> int:
    return sum(name in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def test_a_dma_buf_reaches_the_child_once_and_goes_with_its_mapping(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    child = _child(driver, session)
    buffer = session.alloc(2 * 4096)
    buffer.view()[:4] = b"data"
    prim = Inline(struct.pack("<II", 4, 4))
    for _ in range(3):
        result = session.invoke(
            handle, SC_ECHO, [prim, Slice(buffer, 0, 4)], [Slice(buffer, 4096, 4)]
        )
        assert result.rc == 0
    assert bytes(buffer.view()[4096:4100]) == b"data"  # written in place by the child
    assert _maps_of(child, "fastrpc-dmabuf") == 1  # mapped once, kept for later calls
    session.free(buffer)  # the caller's mapping goes: so does the child's
    wait_until(
        lambda: _maps_of(child, "fastrpc-dmabuf") == 0,
        "the child dropping the buffer",
        timeout=HANG_GUARD,
    )


def test_a_mem_mapped_buffer_is_found_in_the_child_by_fd(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(probe_skel.URI)
    buffer = session.alloc(4096)
    buffer.view()[:8] = b"by fd ok"
    session.map(buffer)
    fd = buffer.fd
    data = _probe(session, handle, probe_skel.SC_BY_FD, struct.pack("<i", fd), 8)
    assert data == b"by fd ok"
    session.unmap(buffer)
    result = session.invoke(
        handle, probe_skel.SC_BY_FD, [Inline(struct.pack("<i", fd))], [Capacity(8)]
    )
    assert result.rc == AEE.EBADPARM.dsp  # unmapped: the child forgot it
    session.free(buffer)


@both_isolations
def test_payloads_larger_than_a_message(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    data = os.urandom(300_000)
    assert _echo(session, handle, data) == data


@both_isolations
def test_a_model_file_larger_than_a_message(session: FastRpcSession, tmp_path: Path) -> None:
    portal = session.remote_open(PORTAL_QNN_URI)
    with (
        onnx_models.opened(tmp_path, "large.onnx", onnx_models.large_add()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        assert _portal_call(session, portal, "model_load", model_uri=exposed.name) == 0


def test_skel_logs_reach_npuds_logger(
    session: FastRpcSession, caplog: pytest.LogCaptureFixture
) -> None:
    portal = session.remote_open(PORTAL_QNN_URI)
    caplog.set_level("WARNING", logger="npud.sim.portal_qnn")
    assert _portal_call(session, portal, "model_load", model_uri="builtin:vad") != 0
    (record,) = [r for r in caplog.records if r.name == "npud.sim.portal_qnn"]
    assert record.getMessage() == "portal_qnn model_load refused"
    assert record.__dict__["uri"] == "builtin:vad"


# -- nothing is left behind -------------------------------------------------------------------------

_LIFE: Final = """
import gc, json, os, sys
from npud.ops.backend import DEV_SHELL
from npud.fastrpc.session import FastRpcSession
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from npud.sim.pd_host import _POOL, live_zygotes

def session(driver):
    s = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
    s.load_shell(DEV_SHELL.read_bytes())
    return s

driver = EmulatedDriver()
s = session(driver)
s.remote_open("file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp")
seen = {"zygotes": live_zygotes(), "child": driver.pd_pid(s.fileno()),
        "workdirs": [z._workdir for z in _POOL.zygotes()]}
if sys.argv[1] == "shutdown":
    s.close()
    driver.shutdown()
elif sys.argv[1] == "garbage":
    s.close()
    del s, driver
    gc.collect()
elif sys.argv[1] == "killed":
    print(json.dumps(seen), flush=True)
    os.kill(os.getpid(), 9)
seen["zygotes_after"] = live_zygotes()
seen["fds"] = sorted(os.listdir("/proc/self/fd"))
print(json.dumps(seen), flush=True)
"""


@pytest.mark.parametrize("ending", ["shutdown", "garbage", "killed"])
def test_nothing_outlives_the_driver_or_npud(ending: str) -> None:
    """In a fresh interpreter (this one holds the tests' zygote for the session)."""
    process = subprocess.run(
        [sys.executable, "-c", _LIFE, ending],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seen = json.loads(process.stdout.splitlines()[0])
    (zygote,) = seen["zygotes"]
    assert _gone(seen["child"])
    assert _gone(zygote)
    assert not any(Path(workdir).exists() for workdir in seen["workdirs"])
    if ending != "killed":
        assert process.returncode == 0, process.stderr
        assert seen["zygotes_after"] == []
        # stdin, stdout, stderr and the listing's own fd: nothing of the emulator stays
        assert len(seen["fds"]) == 4, seen["fds"]


@pytest.mark.parametrize("mode", [0, 1], ids=["begun-unmetered", "ended-never-begun"])
def test_a_child_that_lies_about_its_work_is_ended(
    driver: EmulatedDriver, session: FastRpcSession, mode: int
) -> None:
    """The driver keeps what a call's pieces of work are (issue 28, item 1): a piece begun
    where the compute is not modelled, or ended without a beginning, breaks the wire."""
    handle = session.remote_open(probe_skel.URI)
    child = _child(driver, session)
    with pytest.raises(RpcError) as caught:
        session.invoke(handle, probe_skel.SC_LIE_ABOUT_WORK, [Inline(struct.pack("<I", mode))], [])
    assert caught.value.code is ErrorCode.DSP_RESTARTED
    assert _gone(child)

"""Session fixtures: the same tests run on the emulator and, where one exists, the device."""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.fastrpc.kernel.driver import Driver, KernelDriver
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DEVICE_SHELL = Path("/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3")
DEVICE_LIBRARY_PATH = (Path("/usr/lib/dsp/cdsp"), Path("/usr/lib/dsp"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fastrpc_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastrpc-listener"]


@pytest.fixture(
    params=[
        pytest.param("emulator"),
        pytest.param("kernel", marks=pytest.mark.hardware),
    ]
)
def driver(request: pytest.FixtureRequest) -> Driver:
    if request.param == "kernel":
        if not glob.glob("/dev/fastrpc-cdsp*"):
            pytest.skip("no FastRPC device node")
        return KernelDriver()
    return EmulatedDriver()


@pytest.fixture
def emulator() -> EmulatedDriver:
    return EmulatedDriver()


@pytest.fixture
def shell_bytes(driver: Driver) -> bytes:
    if isinstance(driver, KernelDriver):
        if not DEVICE_SHELL.exists():
            pytest.skip(f"{DEVICE_SHELL} is not installed")
        return DEVICE_SHELL.read_bytes()
    return DEV_SHELL.read_bytes()


def library_path(driver: Driver) -> tuple[Path, ...]:
    return DEVICE_LIBRARY_PATH if isinstance(driver, KernelDriver) else (DSP_LIBRARY_DIR,)


@pytest.fixture
def session(driver: Driver, shell_bytes: bytes) -> Iterator[FastRpcSession]:
    """A session with the shell loaded; on close, nothing may be left behind."""
    fds_before = open_fds()
    s = FastRpcSession.open(driver, library_path=library_path(driver))
    s.load_shell(shell_bytes)
    yield s
    s.close()
    assert open_fds() == fds_before, "the session leaked fds"
    assert not fastrpc_threads(), "the listener thread outlived its session"

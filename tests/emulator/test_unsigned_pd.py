"""The unsigned PD is asked for only where the DSP says it has one (issue 21, item 3).

Capability UNSIGNED_PD_SUPPORT (attribute 1) tells; Qualcomm's examples read it
before they enable the unsigned PD. ``SimConfig(capabilities={1: 0})`` is a
DSP firmware without it: its answer is 0 and it refuses an unsigned
INIT_CREATE.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from npu_protocol import AEE, ErrorCode
from npud.backend import DEV_SHELL
from npud.fastrpc import abi
from npud.fastrpc.errors import RpcError
from npud.fastrpc.session import FastRpcSession
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator.conftest import fastrpc_threads

NO_UNSIGNED_PD = SimConfig(capabilities={abi.UNSIGNED_PD_SUPPORT: 0})


def test_a_dsp_without_the_unsigned_pd_is_refused_with_a_clear_error() -> None:
    driver = EmulatedDriver(NO_UNSIGNED_PD)
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        assert not session.capabilities.unsigned_pd
        with pytest.raises(RpcError) as caught:
            session.load_shell(DEV_SHELL.read_bytes())
        assert caught.value.code is ErrorCode.UNSUPPORTED
        message = str(caught.value)
        assert "UNSIGNED_PD_SUPPORT = 0" in message
        assert "CDSP firmware" in message
        assert "v73" in message
        assert not session.shell_loaded
        assert driver.statistics().dsp_processes == 0  # no INIT_CREATE was sent
    finally:
        session.close()
    assert not fastrpc_threads()


def test_a_signed_pd_is_still_created_there() -> None:
    driver = EmulatedDriver(NO_UNSIGNED_PD)
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes(), attrs=0)
        assert session.shell_loaded
    finally:
        session.close()


def test_a_dsp_that_cannot_say_is_asked_anyway() -> None:
    driver = EmulatedDriver(SimConfig(capability_api=False))
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        assert not session.capabilities.available
        session.load_shell(DEV_SHELL.read_bytes())
        assert session.shell_loaded
    finally:
        session.close()


def test_the_emulated_firmware_refuses_an_unsigned_create() -> None:
    driver = EmulatedDriver(NO_UNSIGNED_PD)
    shell = DEV_SHELL.read_bytes()
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        image = ctypes.create_string_buffer(shell, len(shell))
        create = abi.fastrpc_init_create(
            filelen=len(shell),
            filefd=0,
            attrs=abi.FASTRPC_MODE_UNSIGNED_MODULE,
            siglen=0,
            file=ctypes.addressof(image),
        )
        rc = driver.ioctl(fd, abi.FASTRPC_IOCTL_INIT_CREATE, create)
        assert rc == AEE.EUNSUPPORTED.dsp
        assert driver.statistics().dsp_processes == 0
    finally:
        driver.close(fd)

"""The unsigned PD and capability UNSIGNED_PD_SUPPORT (issue 21, item 3; issue 29, item 8).

Qualcomm's sample apps read attribute 1 before they enable the unsigned PD;
libcdsprpc never does. npud asks for it as libcdsprpc does, and only warns when
the answer is 0; if the firmware then refuses the create, the error says why.
``SimConfig(capabilities={1: 0})`` is a DSP firmware without it: its answer is
0 and it refuses an unsigned INIT_CREATE; ``unsigned_pd_runs=True`` makes one
whose answer is 0 but which creates it all the same.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npu_protocol import AEE, ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL, select_profile
from npud.ops.config import ConfigError, parse_config
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
        assert "refused the unsigned PD (result 0x" in message
        assert not session.shell_loaded
        assert driver.statistics().dsp_processes == 0  # the firmware refused the create
    finally:
        session.close()
    assert not fastrpc_threads()


def test_an_answer_of_0_only_warns_when_the_firmware_runs_the_unsigned_pd(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # libcdsprpc never reads attribute 1: a firmware that answers 0 and still creates
    # the unsigned PD serves every other program, so it serves npud too.
    driver = EmulatedDriver(
        SimConfig(capabilities={abi.UNSIGNED_PD_SUPPORT: 0}, unsigned_pd_runs=True)
    )
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        assert not session.capabilities.unsigned_pd
        with caplog.at_level(logging.WARNING, logger="npud.fastrpc.session"):
            session.load_shell(DEV_SHELL.read_bytes())
        assert session.shell_loaded
        assert driver.statistics().dsp_processes == 1
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("UNSIGNED_PD_SUPPORT = 0" in m and "libcdsprpc" in m for m in warned)
    finally:
        session.close()


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


def test_the_emulator_section_sets_the_device_behaviours(tmp_path: Path) -> None:
    config = parse_config(
        "[backend]\nkind = 'emulator'\n"
        "[emulator]\nunsigned_pd_support = false\ndomain_handles = false\n"
        "absent_module_result = 0x80000600\nloader_probes = ['oemconfig.so']\n"
    )
    driver = select_profile(config).make_driver()
    assert isinstance(driver, EmulatedDriver)
    sim = driver.config
    assert (sim.unsigned_pd_support, sim.domain_handles) == (False, False)
    assert (sim.absent_module_result, sim.loader_probes) == (0x80000600, ("oemconfig.so",))
    with pytest.raises(ConfigError, match="absent_module_result"):
        parse_config("[emulator]\nabsent_module_result = 0\n")


def test_npud_stops_with_the_reason_on_a_firmware_without_unsigned_pds(tmp_path: Path) -> None:
    config = tmp_path / "npud.toml"
    config.write_text("[emulator]\nunsigned_pd_support = false\n")
    command = [sys.executable, "-m", "npud.daemon.main", "--backend", "emulator"]
    command += ["--config", str(config), "--socket", str(tmp_path / "npud.sock")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 69  # EX_UNAVAILABLE: no NPU npud can use
    assert "UNSIGNED_PD_SUPPORT = 0" in result.stderr


def test_the_firmware_creates_the_unsigned_pd_as_it_answers_unless_set_apart() -> None:
    assert SimConfig(capabilities={1: 0}, unsigned_pd_runs=True).creates_unsigned_pd
    assert not SimConfig(capabilities={1: 0}).creates_unsigned_pd
    assert not SimConfig(unsigned_pd_runs=False).creates_unsigned_pd

"""Every way the DSP reads a host file, end to end: skels and models on each apps_std path.

``SimConfig.loader_paths`` makes the simulated DSP's loader use
``fopen_with_env`` (streamed), ``fopen_with_env_fd`` (a DMA-BUF MEM_MAP'd by
the host) or ``get_search_paths_with_env`` + ``stat`` + ``fopen_fd``; the
session serves all three (npud/fastrpc/reverse/apps_std.py). A host that does not
serve a path answers AEE_EUNSUPPORTED and the DSP falls back.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import PortalQnn
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import LOADER_PATHS, LoaderPath
from tests.emulator import onnx_models, sim_helpers
from tests.emulator.conftest import ECHO_URI, open_fds
from tests.emulator.onnx_models import opened


@pytest.fixture(params=LOADER_PATHS)
def path(request: pytest.FixtureRequest) -> LoaderPath:
    value: LoaderPath = request.param
    return value


@pytest.fixture
def driver(path: LoaderPath) -> EmulatedDriver:
    return EmulatedDriver(SimConfig(loader_paths=(path,)))


@pytest.fixture
def session(driver: EmulatedDriver) -> Iterator[FastRpcSession]:
    before = open_fds()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    session.close()
    assert open_fds() == before, "fds leaked"


def echo(session: FastRpcSession, handle: int, data: bytes) -> bytes:
    prim = struct.pack("<II", len(data), len(data))
    result = session.invoke(handle, 0x02020100, [Inline(prim), Inline(data)], [Capacity(len(data))])
    assert result.rc == 0
    return result.output(0)


def test_skels_load_on_every_path(
    path: LoaderPath, driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    assert echo(session, handle, b"loaded") == b"loaded"
    # The _fd paths hand the file over mapped, and give the mapping back at once.
    assert driver.statistics().mem_maps == 0
    assert session.statistics().buffers == 0  # the shared DMA-BUF was the session's, and is gone
    session.remote_close(handle)


def test_a_missing_library_fails_on_every_path(session: FastRpcSession) -> None:
    with pytest.raises(RpcError) as caught:
        session.remote_open("file:///libnothere_skel.so?nothere_skel_handle_invoke")
    assert caught.value.code is ErrorCode.OPEN_FAILED
    assert "libnothere_skel.so: cannot open shared object file" in str(caught.value)


def test_models_load_from_lent_descriptors_on_every_path(
    session: FastRpcSession, driver: EmulatedDriver, tmp_path: Path
) -> None:
    buffer = session.alloc(4096)
    with PortalQnn.open(session, backend="emulator") as portal:
        with opened(tmp_path, "m.onnx", onnx_models.add_one()) as fd:
            model = portal.load(fd)
        assert session.exposed_files == 0
        x = np.arange(8, dtype=np.float32)
        buffer.view()[: x.nbytes] = x.tobytes()
        portal.set_input(model.slot, 0, Slice(buffer, 0, x.nbytes))
        portal.execute(model.slot)
        assert portal.get_output(model.slot, 0, Slice(buffer, 1024, x.nbytes)) == x.nbytes
        y = np.frombuffer(bytes(buffer.view()[1024 : 1024 + x.nbytes]), np.float32)
        np.testing.assert_array_equal(y, x + 1)
        portal.unload(model.slot)
    assert driver.statistics().mem_maps == 0
    session.free(buffer)


def _streaming_only(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
    """A host that serves apps_std's streamed calls only: the rest is AEE_EUNSUPPORTED."""
    if handle == sim_helpers.APPS_STD_HANDLE and (sc >> 24) & 0x1F not in (19, 10, 4, 3):
        return 0x14, []
    return None


def test_the_dsp_falls_back_when_the_host_serves_only_streaming() -> None:
    driver = EmulatedDriver(
        SimConfig(loader_paths=("fopen_with_env_fd", "search_paths", "fopen_with_env"))
    )
    fd = driver.open("/dev/fastrpc-cdsp", os.O_RDWR)
    try:
        assert sim_helpers.init_create(driver, fd) == 0
        responder = sim_helpers.ReverseResponder(driver, fd, hook=_streaming_only).start()
        opened_module = sim_helpers.remotectl_open(driver, fd, ECHO_URI)
        assert (opened_module.result, opened_module.dl_error) == (0, 0)
        methods = [(sc >> 24) & 0x1F for handle, sc in responder.requests if handle != 0]
        # 31 = fopen_with_env_fd (escape), 21 = get_search_paths_with_env: refused;
        # then 19 / 10 / 4 / 3: the streamed path.
        assert methods[:2] == [31, 21]
        assert 19 in methods[2:]
        assert sim_helpers.exit_process(driver, fd) == 0
        responder.join()
    finally:
        driver.close(fd)


def test_a_host_that_serves_no_path_fails_the_load_clearly() -> None:
    driver = EmulatedDriver(SimConfig(loader_paths=("fopen_with_env_fd",)))
    fd = driver.open("/dev/fastrpc-cdsp", os.O_RDWR)
    try:
        assert sim_helpers.init_create(driver, fd) == 0
        responder = sim_helpers.ReverseResponder(driver, fd, hook=_streaming_only).start()
        opened_module = sim_helpers.remotectl_open(driver, fd, ECHO_URI)
        assert opened_module.dl_error == sim_helpers.AEE_ENOSUCHMOD
        assert "serves none of fopen_with_env_fd (AEE_EUNSUPPORTED)" in opened_module.text
        assert sim_helpers.exit_process(driver, fd) == 0
        responder.join()
    finally:
        driver.close(fd)


def test_loader_paths_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown"):
        SimConfig(loader_paths=("mmap",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="distinct"):
        SimConfig(loader_paths=())
    with pytest.raises(ValueError, match="distinct"):
        SimConfig(loader_paths=("fopen_with_env", "fopen_with_env"))

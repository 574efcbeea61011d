"""The DSP's loader reads ENOENT (2) as "not here" and nothing else (issue 21, item 1).

libcdsprpc's apps_std answers errno values; a loader that tries its next
candidate only after ENOENT fails every load when the host answers anything
else for a missing file (npud used to answer AEE_ENOSUCHFILE, 0x45). The
emulator's ``SimConfig.loader_probes`` asks for the files libcdsprpc expects
to be missing before the first library, and its ``search_paths`` loader moves
to the next directory only after ``stat`` answered ENOENT.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import IoctlArg
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import LOADER_PATHS, LoaderPath
from tests.emulator import sim_helpers
from tests.emulator.conftest import ECHO_URI

PROBES = ("oemconfig.so", "testsig-0x5e1f.so", "librpcversion_skel.so")
"""The names libcdsprpc's apps_std_imp.c expects the DSP to ask for and not find."""


class MapWatchingDriver(EmulatedDriver):
    """Records the length of every MEM_MAP."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.mem_map_lengths: list[int] = []

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:  # type: ignore[override]
        if request == abi.FASTRPC_IOCTL_MEM_MAP and isinstance(arg, abi.fastrpc_mem_map):
            self.mem_map_lengths.append(int(arg.length))
        return super().ioctl(fd, request, arg)


def _echo_loads(driver: EmulatedDriver, library_path: list[Path]) -> None:
    session = FastRpcSession.open(driver, library_path=library_path)
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        handle = session.remote_open(ECHO_URI)
        prim = struct.pack("<II", 2, 2)
        result = session.invoke(handle, 0x02020100, [Inline(prim), Inline(b"ok")], [Capacity(2)])
        assert (result.rc, result.output(0)) == (0, b"ok")
        session.remote_close(handle)
    finally:
        session.close()


@pytest.mark.parametrize("path", LOADER_PATHS)
def test_skels_load_past_the_files_the_dsp_probes_for(path: LoaderPath) -> None:
    driver = EmulatedDriver(SimConfig(loader_paths=(path,), loader_probes=PROBES))
    _echo_loads(driver, [DSP_LIBRARY_DIR])


def test_the_search_moves_past_a_directory_without_the_library(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    driver = EmulatedDriver(SimConfig(loader_paths=("search_paths",)))
    _echo_loads(driver, [empty, DSP_LIBRARY_DIR])


def test_fopen_fd_maps_the_file_size_not_whole_pages() -> None:
    driver = MapWatchingDriver(SimConfig(loader_paths=("fopen_with_env_fd",)))
    _echo_loads(driver, [DSP_LIBRARY_DIR])
    size = os.path.getsize(DSP_LIBRARY_DIR / "libecho_skel.so")
    assert size % 4096  # the point of the test: not a whole page
    assert driver.mem_map_lengths == [size]


def _answer_probe_with(code: int) -> sim_helpers.ReplyHook:
    def hook(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        fopen_with_env = handle == sim_helpers.APPS_STD_HANDLE and (sc >> 24) & 0x1F == 19
        if fopen_with_env and inputs[3].rstrip(b"\0").decode() == PROBES[0]:
            return code, []
        return None

    return hook


@pytest.mark.parametrize(
    ("answer", "loads"),
    [(errno.ENOENT, True), (0x45, False), (errno.EACCES, False)],
    ids=["ENOENT", "AEE_ENOSUCHFILE", "EACCES"],
)
def test_the_loader_moves_on_only_after_enoent(answer: int, loads: bool) -> None:
    driver = EmulatedDriver(SimConfig(loader_probes=PROBES[:1]))
    hook = _answer_probe_with(answer)
    with sim_helpers.running_process(driver, hook=hook) as (fd, _responder):
        opened = sim_helpers.remotectl_open(driver, fd, ECHO_URI)
    assert opened.result == 0
    if loads:
        assert opened.dl_error == 0
    else:
        assert opened.dl_error != 0
        assert f"apps_std fopen_with_env answered {answer:#x}" in opened.text


def test_a_stat_answer_other_than_enoent_ends_the_search() -> None:
    def hook(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        if handle != sim_helpers.APPS_STD_HANDLE:
            return None
        method = (sc >> 24) & 0x1F
        if method == 21:  # get_search_paths_with_env: two directories
            caps = [struct.unpack_from("<I", inputs[3], 4 * i)[0] for i in range(8)]
            paths = [b"/first\0", b"/second\0"]
            outs = [struct.pack("<IH2x", 2, 16)]
            outs += [(paths[i] if i < 2 else b"").ljust(caps[i], b"\0") for i in range(8)]
            return 0, outs
        if method == 31 and struct.unpack_from("<I", inputs[0])[0] == 31:  # stat
            return 0x45, []  # not ENOENT: the loader stops here
        return None

    driver = EmulatedDriver(SimConfig(loader_paths=("search_paths",)))
    with sim_helpers.running_process(driver, hook=hook) as (fd, responder):
        opened = sim_helpers.remotectl_open(driver, fd, ECHO_URI)
    assert opened.dl_error != 0
    assert "/first/libecho_skel.so" in opened.text
    assert "stat answered 0x45 (ESRMNT / AEE_ENOSUCHFILE)" in opened.text
    stats = [r for r in responder.requests if r[0] == sim_helpers.APPS_STD_HANDLE]
    assert len(stats) >= 1


def test_loader_probes_are_validated() -> None:
    with pytest.raises(ValueError, match="loader_probes"):
        SimConfig(loader_probes=("",))

"""A path outside the library directories stays refused, and says so (issue 21, item 4).

libcdsprpc opens any absolute path the DSP names; npud opens only what is
inside its configured directories (a security boundary). A refused path is
answered ENOENT (the loader moves on as for a missing file), logged once with
the path, and counted in the session's statistics and in status.
"""

from __future__ import annotations

import logging
import struct

import pytest

from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import LoaderPath
from tests.emulator.conftest import ECHO_URI

OUTSIDE = "/usr/lib/dsp/cdsp/oemconfig.so"


@pytest.mark.parametrize("path", ["fopen_with_env", "fopen_with_env_fd"])
def test_a_refused_path_is_logged_once_and_counted(
    path: LoaderPath, caplog: pytest.LogCaptureFixture
) -> None:
    # The DSP asks twice; the second ask is counted, not logged again.
    driver = EmulatedDriver(SimConfig(loader_paths=(path,), loader_probes=(OUTSIDE, OUTSIDE)))
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        with caplog.at_level(logging.WARNING, logger="npud.fastrpc.reverse.apps_std"):
            for _ in range(2):  # the probes come before the process's first library only
                handle = session.remote_open(ECHO_URI)
                prim = struct.pack("<II", 2, 2)
                result = session.invoke(
                    handle, 0x02020100, [Inline(prim), Inline(b"ok")], [Capacity(2)]
                )
                assert (result.rc, result.output(0)) == (0, b"ok")
                session.remote_close(handle)
        assert session.statistics().refused_paths == 2
        refusals = [r for r in caplog.records if "outside the library" in r.getMessage()]
        assert [getattr(r, "path", None) for r in refusals] == [OUTSIDE]
    finally:
        session.close()

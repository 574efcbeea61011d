"""The emulated FastRPC kernel driver and simulated CDSP (see docs/emulator.md).

``EmulatedDriver`` implements the ``npud.fastrpc.driver.Driver`` seam, so the
session code that talks to ``/dev/fastrpc-cdsp*`` on the device runs unchanged
in tests. ``DSP_LIBRARY_DIR`` holds the skel descriptors
(``libecho_skel.so``, ``libnpu_test_skel.so``, ``libportal_qnn_skel.so``) that
the simulated DSP loads through the session's reverse-RPC listener: put it on
``ADSP_LIBRARY_PATH``.
"""

from __future__ import annotations

import pathlib
from typing import Final

from npud.sim.config import SimConfig
from npud.sim.driver import EmulatedDriver
from npud.sim.statistics import SimStatistics

DSP_LIBRARY_DIR: Final = pathlib.Path(__file__).resolve().parent / "dsp_libs"
"""Directory of the simulator's skel libraries (package data)."""

__all__ = ["DSP_LIBRARY_DIR", "EmulatedDriver", "SimConfig", "SimStatistics"]

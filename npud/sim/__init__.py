"""The emulated FastRPC kernel driver and simulated CDSP (see docs/emulator.md).

``EmulatedDriver`` implements the ``npud.fastrpc.kernel.driver.Driver`` seam, so the
session code that talks to ``/dev/fastrpc-cdsp*`` on the device runs unchanged
in tests. ``DSP_LIBRARY_DIR`` holds the skel descriptors
(``libecho_skel.so``, ``libnpu_test_skel.so``, ``libportal_qnn_skel.so``,
``libdspqueue_rpc_skel.so``, ``libggml-htp-v73.so``) that the simulated DSP
loads through the session's reverse-RPC listener: put it on
``ADSP_LIBRARY_PATH``.

The classes load on first use, so naming ``DSP_LIBRARY_DIR`` costs nothing.
"""

from __future__ import annotations

import importlib
import pathlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from npud.sim.config import SimConfig
    from npud.sim.driver import EmulatedDriver
    from npud.sim.statistics import SimStatistics

DSP_LIBRARY_DIR: Final = pathlib.Path(__file__).resolve().parent / "dsp_libs"
"""Directory of the simulator's skel libraries (package data)."""

_LAZY: Final = {
    "EmulatedDriver": "npud.sim.driver",
    "SimConfig": "npud.sim.config",
    "SimStatistics": "npud.sim.statistics",
}

__all__ = ["DSP_LIBRARY_DIR", "EmulatedDriver", "SimConfig", "SimStatistics"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

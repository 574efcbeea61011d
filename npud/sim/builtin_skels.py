"""The skels the emulated DSP knows by name: its built-in libraries.

A registry apart from :mod:`npud.sim.skels` (the skel framework), so the framework
imports none of the skels built on it. The heavy ones load at their first open.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from npud.sim.skels import EchoSkel, NpuTestSkel, Skel, SkelFactory


def _portal_qnn() -> Skel:
    # Imported on first open: onnxruntime costs a daemon that never runs a model
    # tens of milliseconds of start-up and memory.
    from npud.sim.portal_qnn import PortalQnnSkel  # noqa: PLC0415

    return PortalQnnSkel()


def _dspqueue_rpc() -> Skel:
    from npud.sim.skels_dspqueue_rpc import DspQueueRpcSkel  # noqa: PLC0415

    return DspQueueRpcSkel()


def _htp_iface() -> Skel:
    from npud.sim.htp.skel import HtpIfaceSkel  # noqa: PLC0415 - numpy, on first open

    return HtpIfaceSkel()


BUILTIN_SKELS: Final[Mapping[str, SkelFactory]] = MappingProxyType(
    {
        EchoSkel.name: EchoSkel,
        NpuTestSkel.name: NpuTestSkel,
        "portal_qnn": _portal_qnn,
        "dspqueue_rpc": _dspqueue_rpc,
        "htp_iface": _htp_iface,
    }
)

"""What the DSP says it can do: GET_DSP_INFO, with the old-kernel copy-back quirk handled.

Kernels before the 2024 fix ("misc: fastrpc: Copy the complete capability
structure to user") copied back only the 4-byte answer, to offset 0 of the
struct (over ``domain``), leaving ``capability`` untouched. Guessing from the
struct after the fact cannot work for every answer: an answer of 3 written
over ``domain`` = 3 looks like an unchanged struct with answer 0. So the
first query is a probe with a known answer: attribute 0 (DOMAIN_SUPPORT),
which the kernel always answers 0 itself. A fixed kernel leaves ``domain`` at
3; a buggy one writes the 0 over it. Every later answer is read from the
offset that probe showed.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError

# libcdsprpc's internal attributes (fastrpc_common.h, enum fastrpc_internal_attributes)
# that the kernel answers from the DSP's table like the public ones: libcdsprpc asks
# for them (DSPSIGNAL_DSP_SUPPORT decides dspqueue's signalling, with the driver's
# 259, which libcdsprpc answers 0 itself on mainline), and so may programs.
PERF_V2_DSP_SUPPORT: Final = 128
MAP_DMA_HANDLE_REVERSERPC: Final = 129
DSPSIGNAL_DSP_SUPPORT: Final = 130
PROC_SHARED_BUFFER_SUPPORT: Final = 131

# The attributes we ask for at session start (reference section 2).
QUERIED_ATTRIBUTES: Final = (
    abi.UNSIGNED_PD_SUPPORT,
    abi.HVX_SUPPORT_64B,
    abi.HVX_SUPPORT_128B,
    abi.VTCM_PAGE,
    abi.VTCM_COUNT,
    abi.ARCH_VER,
    abi.HMX_SUPPORT_DEPTH,
    abi.HMX_SUPPORT_SPATIAL,
    abi.ASYNC_FASTRPC_SUPPORT,
    abi.STATUS_NOTIFICATION_SUPPORT,
    abi.MCID_MULTICAST,
    PERF_V2_DSP_SUPPORT,
    MAP_DMA_HANDLE_REVERSERPC,
    DSPSIGNAL_DSP_SUPPORT,
    PROC_SHARED_BUFFER_SUPPORT,
)
PROBE_ATTRIBUTE: Final = 0
"""DOMAIN_SUPPORT: the kernel's own table answers it with 0, on every kernel."""
STATUS_NOTIFICATION_V2: Final = 3
"""libcdsprpc (fastrpc_cap.c) counts status notification as supported only when
the DSP answers exactly 3 (STATUS_NOTIF_V2); any other value, 1 included, is not."""


@dataclass(frozen=True)
class DspInfo:
    """A snapshot of the capability table; ``available`` is False on DSPs without the API."""

    available: bool
    raw: Mapping[int, int] = field(default_factory=dict)

    def _get(self, attribute: int) -> int:
        return self.raw.get(attribute, 0)

    @property
    def arch_version(self) -> int:
        return self._get(abi.ARCH_VER)

    @property
    def arch(self) -> str:
        """``"v73"`` for ARCH_VER 0x73; ``"unknown"`` when the DSP does not say."""
        version = self.arch_version & 0xFF
        return f"v{version:x}" if version else "unknown"

    @property
    def unsigned_pd(self) -> bool:
        return bool(self._get(abi.UNSIGNED_PD_SUPPORT))

    @property
    def hvx_64b(self) -> int:
        return self._get(abi.HVX_SUPPORT_64B)

    @property
    def hvx_128b(self) -> int:
        return self._get(abi.HVX_SUPPORT_128B)

    @property
    def vtcm_page(self) -> int:
        return self._get(abi.VTCM_PAGE)

    @property
    def vtcm_count(self) -> int:
        return self._get(abi.VTCM_COUNT)

    @property
    def hmx_depth(self) -> int:
        return self._get(abi.HMX_SUPPORT_DEPTH)

    @property
    def hmx_spatial(self) -> int:
        return self._get(abi.HMX_SUPPORT_SPATIAL)

    @property
    def async_fastrpc(self) -> bool:
        return bool(self._get(abi.ASYNC_FASTRPC_SUPPORT))

    @property
    def status_notification_answer(self) -> int:
        """Attribute 10 as the DSP answered it."""
        return self._get(abi.STATUS_NOTIFICATION_SUPPORT)

    @property
    def status_notification(self) -> bool:
        """Status notifications (version 2): the DSP answers 3, not 1 (libcdsprpc's rule)."""
        return self._get(abi.STATUS_NOTIFICATION_SUPPORT) == STATUS_NOTIFICATION_V2

    def attribute(self, attribute: int) -> int:
        """Any queried attribute as the DSP answered it (0: not reported)."""
        return self._get(attribute)

    def as_dict(self) -> dict[str, int | str | bool]:
        """Stable keys for status output and the wire."""
        return {
            "available": self.available,
            "arch": self.arch,
            "arch_version": self.arch_version,
            "unsigned_pd": self.unsigned_pd,
            "hvx_64b": self.hvx_64b,
            "hvx_128b": self.hvx_128b,
            "vtcm_page": self.vtcm_page,
            "vtcm_count": self.vtcm_count,
            "hmx_depth": self.hmx_depth,
            "hmx_spatial": self.hmx_spatial,
            "async_fastrpc": self.async_fastrpc,
            "status_notification": self.status_notification,
        }


Ioctl = Callable[[abi.fastrpc_ioctl_capability], int]


def query_capability(ioctl: Ioctl, attribute: int, *, copyback_bug: bool = False) -> int:
    """One GET_DSP_INFO query; ``copyback_bug``: the answer lands at offset 0.

    The struct is zeroed and ``domain`` set to CDSP (checked by pre-2025
    kernels); :func:`kernel_copies_to_offset_0` tells which offset to read.
    """
    cap = abi.fastrpc_ioctl_capability(domain=abi.CDSP_DOMAIN_ID, attribute_id=attribute)
    rc = ioctl(cap)
    if rc != 0:
        raise RpcError(ErrorCode.FASTRPC, rc=rc)
    return int(cap.domain if copyback_bug else cap.capability)


def kernel_copies_to_offset_0(ioctl: Ioctl) -> bool:
    """Probe for the pre-2024 copy-back bug with attribute 0, which the kernel answers 0."""
    cap = abi.fastrpc_ioctl_capability(domain=abi.CDSP_DOMAIN_ID, attribute_id=PROBE_ATTRIBUTE)
    rc = ioctl(cap)
    if rc != 0:
        raise RpcError(ErrorCode.FASTRPC, rc=rc)
    return int(cap.domain) != abi.CDSP_DOMAIN_ID


def query_capabilities(ioctl: Ioctl) -> DspInfo:
    """Read the table; EOPNOTSUPP (a DSP without the API) yields ``available=False``.

    Other OSErrors (EPIPE: the DSP is down) propagate: the caller translates them.
    """
    raw: dict[int, int] = {}
    try:
        copyback_bug = kernel_copies_to_offset_0(ioctl)
        for attribute in QUERIED_ATTRIBUTES:
            raw[attribute] = query_capability(ioctl, attribute, copyback_bug=copyback_bug)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return DspInfo(available=False)
        raise
    return DspInfo(available=True, raw=raw)

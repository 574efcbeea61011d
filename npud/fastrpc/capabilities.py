"""What the DSP says it can do: GET_DSP_INFO, with the old-kernel copy-back quirk handled."""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc import abi
from npud.fastrpc.errors import RpcError

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
)


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
        }


Ioctl = Callable[[abi.fastrpc_ioctl_capability], int]


def query_capability(ioctl: Ioctl, attribute: int) -> int:
    """One GET_DSP_INFO query, robust to kernels that copy the answer to offset 0.

    Kernels before the 2024 fix copied back only the 4-byte answer, over
    ``domain``, leaving ``capability`` untouched. We zero the struct, set
    domain to CDSP (checked by pre-2025 kernels), and if ``capability`` is still
    0 while ``domain`` changed, the answer is in ``domain``.
    """
    cap = abi.fastrpc_ioctl_capability(domain=abi.CDSP_DOMAIN_ID, attribute_id=attribute)
    rc = ioctl(cap)
    if rc != 0:
        raise RpcError(ErrorCode.FASTRPC, rc=rc)
    if cap.capability == 0 and cap.domain != abi.CDSP_DOMAIN_ID:
        return int(cap.domain)
    return int(cap.capability)


def query_capabilities(ioctl: Ioctl) -> DspInfo:
    """Read the table; EOPNOTSUPP (a DSP without the API) yields ``available=False``.

    Other OSErrors (EPIPE: the DSP is down) propagate: the caller translates them.
    """
    raw: dict[int, int] = {}
    for attribute in QUERIED_ATTRIBUTES:
        try:
            raw[attribute] = query_capability(ioctl, attribute)
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                return DspInfo(available=False)
            raise
    return DspInfo(available=True, raw=raw)

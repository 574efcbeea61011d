"""SimConfig: what kind of kernel and DSP the emulator pretends to be."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from npud.sim.skels import BUILTIN_SKELS, SkelFactory

# enum remote_dsp_attributes (reference section 2), as literals on purpose.
UNSIGNED_PD_SUPPORT: Final = 1
HVX_SUPPORT_64B: Final = 2
HVX_SUPPORT_128B: Final = 3
VTCM_PAGE: Final = 4
VTCM_COUNT: Final = 5
ARCH_VER: Final = 6
HMX_SUPPORT_DEPTH: Final = 7
HMX_SUPPORT_SPATIAL: Final = 8
ASYNC_FASTRPC_SUPPORT: Final = 9

ARCH_V73: Final = 0x73
"""Hexagon V73, the CDSP of the Snapdragon X Elite (X1E80100)."""

X1E_CDSP_SESSIONS: Final = 12
"""Compute context banks of the X1E CDSP node (SIDs 1-8 and 10-13)."""

DEFAULT_CAPABILITIES: Final[Mapping[int, int]] = MappingProxyType(
    {
        UNSIGNED_PD_SUPPORT: 1,
        HVX_SUPPORT_64B: 0,
        HVX_SUPPORT_128B: 4,  # number of 128-byte HVX contexts
        VTCM_PAGE: 8 * 1024 * 1024,  # bytes
        VTCM_COUNT: 1,
        HMX_SUPPORT_DEPTH: 2,
        HMX_SUPPORT_SPATIAL: 4,
        ASYNC_FASTRPC_SUPPORT: 1,
    }
)
"""The X1E CDSP's answers, except ARCH_VER which comes from ``SimConfig.arch``."""

MAX_DSP_ATTRIBUTES: Final = 256


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Knobs of the emulated kernel driver and DSP; defaults model an X1E80100 laptop.

    * ``sessions``: compute sessions on the CDSP channel, shared by both nodes.
    * ``arch``: the value of capability 6 (ARCH_VER).
    * ``capabilities``: attribute id (1..255) -> value, overriding
      :data:`DEFAULT_CAPABILITIES`; ids not named anywhere answer 0.
    * ``capability_api``: False makes the DSP answer the capability query with
      AEE_EUNSUPPORTED, which the kernel turns into EOPNOTSUPP.
    * ``capability_copyback_bug``: kernels before the 2024 fix wrote the answer
      to offset 0 of the struct (over ``domain``) and left offset 8 alone.
    * ``capability_domain_check``: kernels before K-2026 answered ECHRNG for
      ``domain >= 5`` or ``domain == 1``.
    * ``secure_channel``: the channel lacks ``qcom,non-secure-domain``; then a
      signed INIT_CREATE through ``/dev/fastrpc-cdsp`` is ECONNREFUSED. X1E's
      CDSP is non-secure, hence False.
    * ``reverse_rpc_timeout``: seconds the simulated DSP waits for the session's
      listener to answer a reverse call before a skel load fails.
    * ``max_dma_buf_size``: larger ALLOC_DMA_BUFF requests fail with ENOMEM
      (a memfd could be sparse and huge; the kernel's DMA allocator cannot).
    * ``address_cache``: remember where this process mapped its dma-bufs
      through ``EmulatedDriver.mmap`` and keep the DSP's mapping of a buffer
      while that lives (:mod:`npud.sim.mappings`). False asks the kernel for
      every dma-buf argument and maps every buffer for each call only: the
      behaviour before the cache, for tests that compare and for benchmarks.
    * ``procmap_query``: ask the kernel with the ``PROCMAP_QUERY`` ioctl (Linux
      6.11+) where it has it; False always reads ``/proc/self/maps``, as on
      older kernels.
    * ``dsp_units``: execution units the DSP's calls share (processor sharing:
      with n calls working each runs at min(1, units / n) of full speed, see
      :mod:`npud.sim.compute`); 0 models none (every call runs as if alone).
    * ``skels``: skel name -> factory, the simulated DSP's "installed" skels;
      a descriptor file names one of these.
    """

    sessions: int = X1E_CDSP_SESSIONS
    arch: int = ARCH_V73
    capabilities: Mapping[int, int] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    capability_api: bool = True
    capability_copyback_bug: bool = False
    capability_domain_check: bool = False
    secure_channel: bool = False
    reverse_rpc_timeout: float = 10.0
    max_dma_buf_size: int = 1 << 30
    address_cache: bool = True
    procmap_query: bool = True
    dsp_units: int = 0
    skels: Mapping[str, SkelFactory] = dataclasses.field(default_factory=lambda: BUILTIN_SKELS)

    def __post_init__(self) -> None:
        if not 1 <= self.sessions <= 14:
            raise ValueError(f"sessions={self.sessions}: the kernel allows 1..14 per channel")
        if not 0 <= self.arch <= 0xFFFFFFFF:
            raise ValueError(f"arch={self.arch:#x} does not fit in 32 bits")
        for attribute, value in self.capabilities.items():
            if not 1 <= attribute < MAX_DSP_ATTRIBUTES:
                raise ValueError(
                    f"capability attribute {attribute} is outside 1..{MAX_DSP_ATTRIBUTES - 1}"
                    " (0 is always answered by the kernel)"
                )
            if not 0 <= value <= 0xFFFFFFFF:
                raise ValueError(f"capability {attribute}={value} does not fit in 32 bits")
        if not self.reverse_rpc_timeout > 0:
            raise ValueError(f"reverse_rpc_timeout={self.reverse_rpc_timeout} must be positive")
        if self.dsp_units < 0:
            raise ValueError(f"dsp_units={self.dsp_units}: 0 (unlimited) or more")
        if self.max_dma_buf_size <= 0:
            raise ValueError(f"max_dma_buf_size={self.max_dma_buf_size} must be positive")

    def capability_table(self) -> tuple[int, ...]:
        """The 256 answers of the DSP's attribute table; index 0 is always 0."""
        table = [0] * MAX_DSP_ATTRIBUTES
        for attribute, value in DEFAULT_CAPABILITIES.items():
            table[attribute] = value
        table[ARCH_VER] = self.arch
        for attribute, value in self.capabilities.items():
            table[attribute] = value
        return tuple(table)

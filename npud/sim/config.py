"""SimConfig: what kind of kernel and DSP the emulator pretends to be."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

from npu_protocol import MAX_BUFFER_SIZE
from npud.sim.builtin_skels import BUILTIN_SKELS
from npud.sim.skels import SkelFactory

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
STATUS_NOTIFICATION_SUPPORT: Final = 10

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

AEE_ENOSUCHMOD: Final = 0x8000043E
AEE_ERPC: Final = 0x80000600

LoaderPath = Literal["fopen_with_env", "fopen_with_env_fd", "search_paths"]
"""How the simulated DSP reads a file from the host (docs/emulator.md, Skel loading):

* ``fopen_with_env``: apps_std ``fopen_with_env`` (19), ``flen``, ``fread``
  in chunks, ``fclose``: the file streams through the listener;
* ``fopen_with_env_fd``: ``fopen_with_env_fd`` (36): the host reads the file
  into a DMA-BUF and MEM_MAPs it (FASTRPC_MAP_FD); the DSP reads the mapping
  and gives it back with ``fclose_fd`` (35);
* ``search_paths``: ``get_search_paths_with_env`` (21), then ``stat`` (31) of
  ``<dir>/<file>`` in each directory until one exists, then ``fopen_fd`` (34)
  of that path and ``fclose_fd``.
"""
LOADER_PATHS: Final[tuple[LoaderPath, ...]] = get_args(LoaderPath)

PdIsolation = Literal["thread", "process"]
"""Where a DSP process's skels run (docs/emulator.md, PD processes):

* ``process``: in a child process of its own, unprivileged, forked by a zygote;
* ``thread``: in npud's process, on the caller's thread.
"""
PD_ISOLATIONS: Final[tuple[PdIsolation, ...]] = get_args(PdIsolation)

MIB: Final = 1024 * 1024


DEFAULT_PD_MEMORY_LIMIT: Final = 4 << 30
"""Private memory a PD child may take by default (SimConfig.pd_memory_limit)."""
MAX_PD_MEMORY_LIMIT: Final = 1 << 40


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
    * ``dsp_units``: the HVX contexts that the DSP's calls and every DSP process's
      own work (dspqueue packet handling, llama.cpp's op batches) share (processor
      sharing: with n pieces working each runs at min(1, units / n) of full speed,
      see :mod:`npud.sim.compute`); 0 models none (every piece runs as if alone).
    * ``hmx_units``: the HMX matrix units (1 on the device) that matrix work (a
      model's graph, an op batch with matrix products) shares besides its HVX
      context; 0 models none. Both 0 is the emulator's behaviour before the model.
    * ``report_dsp_time``: a dspqueue ``wait_signal`` answer reports the DSP time of
      the work it answers (``Driver.dsp_report``). False reports none, as a device's
      kernel does, so npud estimates a batch's DSP time as it must there.
    * ``skels``: skel name -> factory, the simulated DSP's "installed" skels;
      a descriptor file names one of these.
    * ``domain_handles``: the DSP has the domain-style ``adsp_listener1``
      (static handle 7) and ``remotectl1`` (8). False models older firmware:
      those handles answer ``absent_module_result``, as 2, 5, 6, 9, 10 do.
    * ``absent_module_result``: what a static handle the DSP lacks answers:
      any non-zero u32. AEE_ENOSUCHMOD (0x8000043E) and AEE_ERPC (0x80000600)
      are the usual ones, and the only ones libcdsprpc's listener falls back
      on; its remotectl falls back on any.
    * ``loader_paths``: the ways the DSP reads host files (:data:`LoaderPath`),
      tried in order; the next is tried when the host answers one with
      AEE_EUNSUPPORTED.
    * ``loader_probes``: files the DSP's loader asks the host for before the
      first library of a process (libcdsprpc expects ``oemconfig.so``,
      ``testsig`` and ``librpcversion_skel.so``, usually missing). A probe the
      host answers ENOENT (2) or serves is passed; any other answer fails the
      load, as a loader that moves on only after ENOENT would.
    * ``initial_heap``: bytes of heap the user PD starts with. None: the
      kernel's rule, max(2 MiB, 4 x shell size) rounded up to 1 MiB. Loading a
      file or a library that does not fit grows the heap through the host's
      ``apps_mem`` (reverse RPC), in whole MiB.
    * ``map_match_fd_only``: kernels before linux-next find an fd's mapping
      by fd number alone: MEM_MAP and INVOKE with an fd number that a
      recorded MEM_MAP mapping was made through use *that* mapping's buffer,
      even when the number now names another buffer (a stale mapping whose
      MEM_UNMAP failed aliases the new one).
    * ``pd_isolation``: ``"process"`` runs each DSP process's skels in a child
      process (:data:`PdIsolation`); ``"thread"`` in npud's process.
    * ``pd_user``: the user PD children run as when npud runs as root (never
      root itself); otherwise they keep npud's uid, without capabilities.
    * ``pd_landlock``: confine PD children with Landlock where the kernel has it
      (read-only Python and system libraries, nothing else of the filesystem).
    * ``pd_memory_limit``: bytes of private memory (``RLIMIT_DATA``: the heap and
      private mappings; buffers mapped from npud are shared and not counted) each PD
      child may take; past it an allocation fails, and a PD whose allocation fails ends
      as a crashed PD does. 0: no limit. Nothing for ``pd_isolation="thread"``.
    * ``dma_heap``: ``/dev/dma_heap/system`` exists. False models a machine
      without the node: its open is ENOENT (rpcmem then uses ALLOC_DMA_BUFF).
    * ``unsigned_pd_runs``: whether the firmware creates an unsigned PD. None:
      as its UNSIGNED_PD_SUPPORT answer says; True or False: a firmware whose
      answer and behaviour differ (libcdsprpc never reads the attribute, so on a
      device only the INIT_CREATE tells).
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
    max_dma_buf_size: int = MAX_BUFFER_SIZE
    address_cache: bool = True
    procmap_query: bool = True
    dsp_units: int = 0
    hmx_units: int = 0
    report_dsp_time: bool = True
    skels: Mapping[str, SkelFactory] = dataclasses.field(default_factory=lambda: BUILTIN_SKELS)
    domain_handles: bool = True
    absent_module_result: int = AEE_ENOSUCHMOD
    loader_paths: tuple[LoaderPath, ...] = ("fopen_with_env",)
    loader_probes: tuple[str, ...] = ()
    initial_heap: int | None = None
    map_match_fd_only: bool = False
    pd_isolation: PdIsolation = "process"
    pd_user: str = "nobody"
    pd_landlock: bool = True
    pd_memory_limit: int = DEFAULT_PD_MEMORY_LIMIT
    dma_heap: bool = True
    unsigned_pd_runs: bool | None = None

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
        if self.hmx_units < 0:
            raise ValueError(f"hmx_units={self.hmx_units}: 0 (unlimited) or more")
        if self.max_dma_buf_size <= 0:
            raise ValueError(f"max_dma_buf_size={self.max_dma_buf_size} must be positive")
        if not 1 <= self.absent_module_result <= 0xFFFFFFFF:
            raise ValueError(
                f"absent_module_result={self.absent_module_result:#x}: a non-zero u32"
                f" (usually AEE_ENOSUCHMOD {AEE_ENOSUCHMOD:#x} or AEE_ERPC {AEE_ERPC:#x})"
            )
        self._check_loader()
        if self.initial_heap is not None and not 0 <= self.initial_heap <= 0xFFFFFFFF:
            raise ValueError(f"initial_heap={self.initial_heap} is outside 0..4 GiB")
        self._check_pd()

    def _check_loader(self) -> None:
        if not self.loader_paths or len(set(self.loader_paths)) != len(self.loader_paths):
            raise ValueError(f"loader_paths={self.loader_paths!r}: one or more distinct paths")
        unknown = [p for p in self.loader_paths if p not in LOADER_PATHS]
        if unknown:
            raise ValueError(f"loader_paths: unknown {unknown!r}; known: {', '.join(LOADER_PATHS)}")
        for probe in self.loader_probes:
            if not probe or "\0" in probe or len(probe.encode()) > 255:
                raise ValueError(f"loader_probes: {probe!r} is not a file name")

    def _check_pd(self) -> None:
        if self.pd_isolation not in PD_ISOLATIONS:
            raise ValueError(
                f"pd_isolation={self.pd_isolation!r}: one of {', '.join(PD_ISOLATIONS)}"
            )
        if not self.pd_user:
            raise ValueError("pd_user must name a user")
        if not 0 <= self.pd_memory_limit <= MAX_PD_MEMORY_LIMIT:
            raise ValueError(f"pd_memory_limit={self.pd_memory_limit}: 0..{MAX_PD_MEMORY_LIMIT}")

    @property
    def unsigned_pd_support(self) -> bool:
        """The DSP runs unsigned PDs: what its UNSIGNED_PD_SUPPORT (1) answers, non-zero."""
        return bool(self.capability_table()[UNSIGNED_PD_SUPPORT])

    @property
    def creates_unsigned_pd(self) -> bool:
        """The firmware creates an unsigned PD (``unsigned_pd_runs``, else its answer)."""
        if self.unsigned_pd_runs is not None:
            return self.unsigned_pd_runs
        return self.unsigned_pd_support

    def heap_for(self, image_size: int) -> int:
        """The user PD's initial heap for a shell of ``image_size`` bytes."""
        if self.initial_heap is not None:
            return self.initial_heap
        wanted = max(2 * MIB, 4 * image_size)
        return (wanted + MIB - 1) // MIB * MIB

    def capability_table(self) -> tuple[int, ...]:
        """The 256 answers of the DSP's attribute table; index 0 is always 0."""
        table = [0] * MAX_DSP_ATTRIBUTES
        for attribute, value in DEFAULT_CAPABILITIES.items():
            table[attribute] = value
        table[ARCH_VER] = self.arch
        for attribute, value in self.capabilities.items():
            table[attribute] = value
        return tuple(table)

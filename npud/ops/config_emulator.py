"""npud.toml's ``[emulator]``: the built-in emulator of the kernel driver and the DSP."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from npud.ops.config_values import Bytes, Id, doc


class EmulatorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The built-in emulator (backend.kind = emulator, or auto without a device). Changes
    need a restart."""

    dsp_units: Annotated[
        int,
        msgspec.Meta(ge=0, le=64),
        doc(
            "The emulated DSP's HVX contexts, shared by its calls and by every DSP "
            "process's own work (llama.cpp's op batches): with n pieces of work running "
            "each runs at min(1, units / n) of full speed, as on a real NPU. 0: every piece "
            "runs as if alone."
        ),
    ] = 0
    hmx_units: Annotated[
        int,
        msgspec.Meta(ge=0, le=8),
        doc(
            "The emulated DSP's HMX matrix units (1 on the device): matrix work (a model's "
            "graph, an op batch with matrix products) shares them besides an HVX context. "
            "0: not modelled."
        ),
    ] = 0
    report_dsp_time: Annotated[
        bool,
        doc(
            "A dspqueue answer reports the DSP time of the op batches it answers, which npud "
            "charges. false: none is reported, as on a device (its kernel reports none), and "
            "npud estimates a batch's time as it does there (docs/scheduling.md)."
        ),
    ] = True
    pd_isolation: Annotated[
        Literal["process", "thread"],
        doc(
            "Where each emulated DSP process runs its skels and models: 'process', in a "
            "child process of its own (unprivileged, an empty working directory; a looping "
            "model burns only that child), or 'thread', on npud's own threads (faster calls, "
            "no confinement: for profiling the daemon)."
        ),
    ] = "process"
    pd_user: Annotated[
        str,
        msgspec.Meta(min_length=1, max_length=32),
        doc("The user the DSP processes' children run as when npud runs as root."),
    ] = "nobody"
    pd_memory_limit: Annotated[
        Bytes,
        doc(
            "Bytes of private memory each DSP process's child may take (RLIMIT_DATA: its "
            "heap and private mappings; the buffers it maps from npud are not counted). A "
            "child that needs more ends as a crashed DSP process does: its domain restarts "
            "and its clients are told (DSP_RESTARTED), npud and other domains see nothing. "
            "0: no limit. pd_isolation = 'thread' has none."
        ),
    ] = 4 << 30
    dma_heap: Annotated[
        bool,
        doc(
            "Emulate the system DMA-BUF heap (/dev/dma_heap/system). false: buffers come "
            "from the FastRPC driver's ALLOC_DMA_BUFF, as on a kernel without the heap."
        ),
    ] = True
    unsigned_pd_support: Annotated[
        bool,
        doc(
            "The emulated DSP runs unsigned PDs (capability UNSIGNED_PD_SUPPORT). false: a "
            "firmware without them, which npud refuses to ask for one (docs/hardware.md)."
        ),
    ] = True
    domain_handles: Annotated[
        bool,
        doc(
            "The emulated DSP has adsp_listener1 and remotectl1 (static handles 7 and 8). "
            "false: an older firmware, whose absent handles answer absent_module_result."
        ),
    ] = True
    absent_module_result: Annotated[
        int,
        msgspec.Meta(ge=1, le=0xFFFFFFFF),
        doc(
            "What the emulated DSP answers for a static handle it lacks (a non-zero u32): "
            "AEE_ENOSUCHMOD 0x8000043E by default; AEE_ERPC is 0x80000600."
        ),
    ] = 0x8000043E
    fault_uids: Annotated[
        tuple[Id, ...],
        doc(
            "Users, besides root, whose calls may run the emulated skels' fault-injecting "
            "methods (npu_test.fault: the DSP process crashes and its domain restarts); "
            "anyone else's are refused (NOT_PERMITTED). Long calls (npu_test.busy) stay "
            "open to all."
        ),
    ] = ()
    loader_probes: Annotated[
        tuple[str, ...],
        doc(
            "Files the emulated DSP's loader asks the host for before a process's first "
            "library (libcdsprpc expects oemconfig.so, testsig, librpcversion_skel.so); each "
            "must be served or answered ENOENT, as on a loader that goes on only after ENOENT."
        ),
    ] = ()

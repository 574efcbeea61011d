"""Plain records nested inside messages: priorities, capabilities, limits, status.

These are untagged msgpack maps keyed by field name. Every field that is not
required has a default, so a newer peer may add fields and an older peer
simply ignores the keys it does not know.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from npu_protocol._wire import (
    DEFAULT_MAX_FRAME_SIZE,
    INLINE_RESERVE,
    MAX_GRAPHS,
    MAX_STATUS_CLIENTS,
    MAX_TENSORS,
    U32,
    U63,
    FrameSizeLimit,
    InlineCapacity,
    Name,
    Shape,
    TensorName,
    Text,
    TimeoutMs,
)
from npu_protocol.errors import MAX_DMA_SIZE


class Priority(enum.StrEnum):
    """Scheduling class a client asks for in its Hello (sent as the lower-case name).

    ``realtime`` is for latency-bound streams (voice: VAD, STT, TTS); ``normal``
    for interactive tools; ``background`` for throughput work that may wait
    (LLM decode, batch jobs). The server may grant a lower class than asked.
    """

    REALTIME = "realtime"
    NORMAL = "normal"
    BACKGROUND = "background"


class _Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the untagged nested maps."""


class DspCapabilities(_Record, frozen=True, kw_only=True):
    """What the DSP reported through GET_DSP_INFO (attribute ids in parentheses).

    Zero means "not supported" or "not reported".
    """

    domain: Name = "cdsp"
    unsigned_pd_support: U32 = 0  # 1
    hvx_support_64b: U32 = 0  # 2
    hvx_support_128b: U32 = 0  # 3
    vtcm_page: U32 = 0  # 4
    vtcm_count: U32 = 0  # 5
    arch_ver: U32 = 0  # 6
    hmx_support_depth: U32 = 0  # 7
    hmx_support_spatial: U32 = 0  # 8
    async_fastrpc_support: U32 = 0  # 9
    status_notification_support: U32 = 0  # 10: the DSP's answer, as it gave it
    mcid_multicast: U32 = 0  # 11
    status_notifications: bool = False
    """Status notifications are supported: attribute 10 answered 3, the only answer
    libcdsprpc counts as supported (older DSPs answer 1 for an earlier scheme)."""
    perf_v2_dsp_support: U32 = 0  # 128
    """Version 6: libcdsprpc's internal attributes 128..131 as the DSP answered them."""
    map_dma_handle_reverserpc: U32 = 0  # 129
    dspsignal_dsp_support: U32 = 0  # 130
    proc_shared_buffer_support: U32 = 0  # 131


class OwnPool(_Record, frozen=True, kw_only=True):
    """Version 4: npud keeps what this connection frees for this connection's next
    allocation of the same size (``pool.share = "client"``), zeroed. The same DMA-BUF
    then comes back (the same inode), so a client may keep its mapping of a buffer it
    freed and use it again instead of mapping the pages anew."""

    idle_ms: U63
    """A kept buffer that no allocation took for this long is released."""
    max_buffer_bytes: U63
    """Larger buffers are never kept: they are released when freed."""


class ClientLimits(_Record, frozen=True, kw_only=True):
    """The limits the server applies to this connection, announced in the Welcome."""

    priority: Priority
    """The class granted, possibly lower than the one requested."""
    max_frame_size: FrameSizeLimit = DEFAULT_MAX_FRAME_SIZE
    """Largest frame payload either side may send from now on."""
    max_in_flight: Annotated[int, msgspec.Meta(ge=1, le=0xFFFF)] = 64
    """Requests the client may have sent and not yet seen answered."""
    max_inline_bytes: InlineCapacity = DEFAULT_MAX_FRAME_SIZE - INLINE_RESERVE
    """Per invoke: the sum of inline input lengths, and separately the sum of
    inline output capacities, may not exceed this."""
    max_buffers: U32 = 1024
    max_buffer_bytes: U63 = 1 << 30
    """Sum of the sizes of this client's live buffers."""
    max_buffer_size: U63 = MAX_DMA_SIZE
    """Version 6: the largest buffer ``alloc`` gives (the request's size, before page
    rounding); absent from an older server, whose largest is 256 MiB."""
    max_handles: U32 = 64
    max_models: U32 = 8
    """Version 2: models this client may have loaded at once."""
    max_model_bytes: U63 = 1 << 30
    """Version 2: sum over this client's models of file size plus tensor arena."""
    max_timeout_ms: TimeoutMs = 600_000
    default_timeout_ms: TimeoutMs | None = None
    """Applied to invokes that carry no timeout; None waits for the DSP."""

    def __post_init__(self) -> None:
        # An invoke within the inline limit must always fit in one frame.
        if self.max_inline_bytes > self.max_frame_size - INLINE_RESERVE:
            raise ValueError(
                f"max_inline_bytes {self.max_inline_bytes} leaves less than "
                f"{INLINE_RESERVE} bytes of a {self.max_frame_size}-byte frame"
            )
        if self.default_timeout_ms is not None and self.default_timeout_ms > self.max_timeout_ms:
            raise ValueError(
                f"default_timeout_ms {self.default_timeout_ms} exceeds "
                f"max_timeout_ms {self.max_timeout_ms}"
            )


class TensorInfo(_Record, frozen=True, kw_only=True):
    """One input or output of a model, and where it lives in the model's arena."""

    name: TensorName
    dtype: Name
    """The numpy name of its element type (``float32``, ``int64``, ``bool``...); QNN's
    fixed-point types name the integers that hold them (``uint8``...)."""
    qnn_type: U32 = 0
    """QNN's data type code (idl/portal_qnn.idl), e.g. 0x0232 for float32."""
    shape: Shape = ()
    nbytes: U32
    """The tensor's size: the product of the shape times the element size."""
    offset: U32
    """Where the tensor starts in the model's arena (the DMA-BUF of the load reply)."""


MAX_CONSTANT_VALUES = 256
"""Values in one ``ModelConstant``, at most (a sample rate, a few scales: not data)."""
MAX_CONSTANTS = 16
"""``ModelLoadRequest.constants`` entries, at most."""


class ModelConstant(_Record, frozen=True, kw_only=True):
    """A value an ONNX model's input is fixed to at load (``model_load.constants``)."""

    dtype: Name
    """The values' numpy type name: an integer type (``int64``...), ``float32`` /
    ``float64``, or ``bool``; the server converts them to the input's own type within
    their kind (an integer into a float input too), never across it."""
    shape: Annotated[
        tuple[Annotated[int, msgspec.Meta(ge=1, le=MAX_CONSTANT_VALUES)], ...],
        msgspec.Meta(max_length=8),
    ] = ()
    """Its dimensions (empty: a scalar); the input's, where the model fixes them."""
    values: Annotated[
        tuple[int | float, ...], msgspec.Meta(min_length=1, max_length=MAX_CONSTANT_VALUES)
    ]
    """Row-major, as many as the shape holds; a bool is 0 or 1."""


class GraphInfo(_Record, frozen=True, kw_only=True):
    """Version 5: one graph of a model, its own tensors and where they live in the arena."""

    name: TensorName = ""
    """The name the model gives the graph (a QNN context binary's graph name, a graph
    pack's name on the emulator); what ``model_run.graph`` names. Empty when the model
    or the DSP gives none."""
    inputs: Annotated[tuple[TensorInfo, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()
    outputs: Annotated[tuple[TensorInfo, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()


class ModelInfo(_Record, frozen=True, kw_only=True):
    """A loaded model: its tensors and the arena that holds them."""

    name: Text = ""
    """The name the client gave at load (shown in status), e.g. the file's name."""
    description: Text = ""
    """What the daemon found the file to be (format, version)."""
    file_bytes: U63 = 0
    arena_bytes: U32
    """Size of the arena DMA-BUF: every input, then every output, at their offsets (of
    each graph in turn)."""
    inputs: Annotated[tuple[TensorInfo, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()
    outputs: Annotated[tuple[TensorInfo, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()
    runs: U63 = 0
    """Runs completed since load."""
    graphs: Annotated[tuple[GraphInfo, ...], msgspec.Meta(max_length=MAX_GRAPHS)] = ()
    """Version 5: every graph of the model in index order, each with its own tensors in
    its own regions of the arena; ``inputs`` and ``outputs`` are the first graph's."""


class ModelRow(_Record, frozen=True, kw_only=True):
    """One loaded model of a client, as the status reply shows it."""

    id: U32
    name: Text = ""
    bytes: U63 = 0
    """What the model counts against ``max_model_bytes``: file size plus arena."""
    runs: U63 = 0
    dsp_us: U63 = 0
    """DSP time of its runs, µs."""


class ShellStatus(_Record, frozen=True, kw_only=True):
    """Outcome of verifying the DSP shell image at start-up."""

    verified: bool
    path: Text = ""
    sha256: Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{64})?$")] = ""
    detail: Text = ""


class Totals(_Record, frozen=True, kw_only=True):
    """Daemon-wide sums over every connected client."""

    clients: U32 = 0
    buffers: U32 = 0
    bytes: U63 = 0
    mappings: U32 = 0
    handles: U32 = 0
    calls_in_flight: U32 = 0
    calls_done: U63 = 0
    models: U32 = 0
    model_bytes: U63 = 0


class HoldRow(_Record, frozen=True, kw_only=True):
    """Version 7 (additive): a background client's op batches the scheduler held for
    other clients' work, for one reason (PROTOCOL.md section 8, "Op batches")."""

    reason: Name
    """``realtime_on_dsp`` (a realtime call ran or waited), ``realtime_due`` (one calling
    in rhythm was due before the batch would end), ``realtime_overdue`` (its call was
    late: the host delayed it) or ``normal_on_dsp`` (a normal call ran or waited); a
    newer server may send others."""
    batches: U63 = 0
    """Batches first held for this reason, counted when they went."""
    held_us: U63 = 0
    """Their time held, doorbell's arrival to its passing on, µs."""


class ClientRow(_Record, frozen=True, kw_only=True):
    """One connected client as the status reply shows it."""

    pid: U32
    uid: U32
    name: Name
    priority: Name
    """A Priority value; kept as text so an older reader accepts newer classes."""
    buffers: U32 = 0
    bytes: U63 = 0
    mappings: U32 = 0
    handles: U32 = 0
    calls_in_flight: U32 = 0
    calls_done: U63 = 0
    dsp_us: U63 = 0
    """DSP time this client's calls used (wall time from dispatch to return), µs."""
    queued: U32 = 0
    """Calls waiting for a DSP slot."""
    running: U32 = 0
    """Calls on the DSP now."""
    wait_p50_us: U63 = 0
    wait_p99_us: U63 = 0
    """Recent queue waits (arrival to dispatch), median and 99th percentile, µs."""
    misses: U63 = 0
    """Calls that finished after their deadline."""
    late: U63 = 0
    """Calls refused because their deadline passed before dispatch."""
    overruns: U63 = 0
    """Periods in which a budgeted realtime client used more than its budget."""
    budget_period_us: U63 = 0
    budget_us: U63 = 0
    """The declared realtime budget (0: none)."""
    domain: Name = ""
    """The domain (DSP process) the client's calls run in."""
    hung_calls: U32 = 0
    """Calls of this client the watchdog caught (each one restarted its domain)."""
    throttled: bool = False
    """The client pays for a hung call: its calls run one at a time, as background."""
    models: Annotated[tuple[ModelRow, ...], msgspec.Meta(max_length=64)] = ()
    """The client's loaded models."""
    held: Annotated[tuple[HoldRow, ...], msgspec.Meta(max_length=8)] = ()
    """Version 7 (additive): its op batches held for other clients' work, by reason (none held:
    empty; a server before it: empty)."""


class SchedulerRow(_Record, frozen=True, kw_only=True):
    """The scheduler: what waits, what runs, how busy the DSP is."""

    mode: Name = "fair"
    """``fair`` (classes, deadlines, fair share) or ``fifo`` (arrival order)."""
    dsp_slots: U32 = 0
    queued_realtime: U32 = 0
    queued_normal: U32 = 0
    queued_background: U32 = 0
    running_realtime: U32 = 0
    running_normal: U32 = 0
    running_background: U32 = 0
    utilisation_pct: U32 = 0
    """Recent average of busy slots, percent of ``dsp_slots``."""
    realtime_declared_pct: U32 = 0
    """Admitted realtime budgets, percent of the DSP."""
    dispatched: U63 = 0
    late: U63 = 0


class Budget(_Record, frozen=True, kw_only=True):
    """A realtime client's declaration in its Hello: at most ``budget_us`` of DSP time
    every ``period_us``."""

    period_us: Annotated[int, msgspec.Meta(ge=100, le=10_000_000)]
    budget_us: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]

    def __post_init__(self) -> None:
        if self.budget_us > self.period_us:
            raise ValueError(
                f"budget_us {self.budget_us} is more than its period_us {self.period_us}"
            )


class SessionRow(_Record, frozen=True, kw_only=True):
    """The FastRPC session as the daemon sees it (for people and monitoring)."""

    state: Name
    """``up``, ``dead`` (a restart was seen, recovery is starting) or ``restarting``."""
    buffers: U32 = 0
    """DMA-BUFs the session holds (the clients' and its own)."""
    remote_handles: U32 = 0
    invokes_in_flight: U32 = 0
    invokes_done: U63 = 0
    """Invokes issued since this session opened (remotectl and listener calls included)."""
    listener_running: bool = False
    """The reverse-RPC listener serves the DSP (without it no skel can load)."""
    listener_requests: U63 = 0
    listener_stopped_because: Text = ""
    """Why the listener ended, once it has; empty while it runs."""
    refused_paths: U63 = 0
    """Files the DSP asked for outside the library directories, refused (each is logged
    once with its path; docs/hardware.md says how to allow a directory)."""
    interrupted_contexts: U32 = 0
    """Version 6 (additive): calls of this session that system suspends interrupted; the
    kernel keeps each one's context until the session's fd closes."""


class LaneRow(_Record, frozen=True, kw_only=True):
    """One pool of the daemon's threads (PROTOCOL.md section 7.5, Lanes)."""

    name: Name
    """A domain's ``control``, ``loader`` or ``waits``; the daemon's ``closer``."""
    threads: U32 = 0
    queued: U32 = 0
    running: U32 = 0
    completed: U63 = 0


class DomainRow(_Record, frozen=True, kw_only=True):
    """One domain: one DSP process (one FastRPC session) and the clients it serves."""

    name: Name
    """``default``, a configured domain's name, or ``NAME#N`` for the N-th isolated one."""
    isolated: bool = False
    """Opened for one client alone, and closed when it goes."""
    state: Name = "up"
    """``starting``, ``up``, ``dead`` (a fault was seen, recovery starts), ``restarting``,
    ``closing`` or ``closed``."""
    epoch: U63 = 0
    """Starts at 1, grows by one at every restart of this domain's DSP process."""
    restarts: U32 = 0
    hung_calls: U32 = 0
    """Calls the watchdog caught in this domain."""
    clients: U32 = 0
    mappings: U32 = 0
    """Buffers mapped into this DSP process."""
    mapped_bytes: U63 = 0
    """Their total size: the memory this DSP process can reach."""
    remote_handles: U32 = 0
    models: U32 = 0
    """Model loads held, each shared by the clients that loaded the same model."""
    invokes_in_flight: U32 = 0
    invokes_done: U63 = 0
    """FastRPC calls of its current session (back to 0 at a restart)."""
    uptime_ms: U63 = 0
    invokes_total: U63 = 0
    """FastRPC calls since the domain opened, every session of it: never goes back."""
    lanes: Annotated[tuple[LaneRow, ...], msgspec.Meta(max_length=8)] = ()
    """Its threads (version 6, section 7.5: ``control``, ``loader``, ``waits``); a server
    before 6 sent the default domain's in the status's ``lanes``."""
    interrupted_contexts: U32 = 0
    """Version 6 (additive): calls of its session that system suspends interrupted, whose
    contexts the kernel keeps until the session's fd closes."""
    suspend_reopens: U32 = 0
    """Version 6 (additive): sessions reopened to free those contexts (``[domains]
    reopen_at_interrupted_contexts``); each is a restart its clients saw."""
    dsp_us: U63 = 0
    """DSP time of its clients' calls and op batches (doorbell to answer) since it
    opened, in microseconds (0 from a server that does not count it)."""


class MemoryRow(_Record, frozen=True, kw_only=True):
    """The DMA-BUFs held for clients and kept by the pool."""

    source: Name = "heap"
    """``heap``: the system DMA-BUF heap; ``fastrpc``: the FastRPC driver (no heap)."""
    buffers: U32 = 0
    bytes: U63 = 0


class PoolRow(_Record, frozen=True, kw_only=True):
    """The buffer pool: freed DMA-BUFs kept, zeroed, for the next allocation of their size.

    Counters count since the daemon started; the rest is now.
    """

    enabled: bool = False
    share: Name = "client"
    """Who may get a buffer another connection freed: ``client`` (only that connection)
    or ``user`` (any connection of the same uid)."""
    buffers: U32 = 0
    """Buffers kept now, zeroed or waiting to be."""
    bytes: U63 = 0
    max_bytes: U63 = 0
    mapped: U32 = 0
    """Kept buffers still mapped into the DSP."""
    scrubbing: U32 = 0
    """Kept buffers not zeroed yet (no allocation gets one before it is)."""
    hits: U63 = 0
    """Allocations served with a kept buffer."""
    misses: U63 = 0
    """Allocations that found none of their size and allocated a new buffer."""
    kept: U63 = 0
    """Freed buffers the pool took in."""
    passed: U63 = 0
    """Freed buffers released at once: the pool off, too large, or still used by an invoke."""
    evicted: U63 = 0
    """Kept buffers released to stay within ``max_bytes``."""
    trimmed: U63 = 0
    """Kept buffers released after the idle time without an allocation taking them."""
    dropped: U63 = 0
    """Kept buffers released because their connection ended, the DSP restarted or the
    configuration changed."""
    scrubbed_bytes: U63 = 0
    scrub_us: U63 = 0
    """Time spent zeroing buffers, µs."""


class DaemonStatus(_Record, frozen=True, kw_only=True):
    """Everything ``npuctl status`` shows."""

    daemon_version: Name
    uptime_ms: U63
    backend: Name
    """``kernel`` on a device, ``emulator`` on the in-process emulator."""
    device: Text
    """The FastRPC device node in use."""
    dsp: DspCapabilities
    shell: ShellStatus
    epoch: U63
    """Session epoch: starts at 1 and grows by one at every DSP session restart."""
    restarts: U32 = 0
    totals: Totals = msgspec.field(default_factory=Totals)
    clients: Annotated[tuple[ClientRow, ...], msgspec.Meta(max_length=MAX_STATUS_CLIENTS)] = ()
    session: SessionRow | None = None
    """None while no session has been opened yet."""
    lanes: Annotated[tuple[LaneRow, ...], msgspec.Meta(max_length=16)] = ()
    """The daemon's own lanes (``closer``); before version 6, the default domain's too
    (each domain's are in its row from 6 on)."""
    scheduler: SchedulerRow | None = None
    pool: PoolRow | None = None
    """None from a daemon that does not report it."""
    domains: Annotated[tuple[DomainRow, ...], msgspec.Meta(max_length=64)] = ()
    """Every domain (DSP process); empty from a daemon before domains. ``epoch``,
    ``restarts`` and ``session`` describe the default domain."""
    memory: MemoryRow | None = None

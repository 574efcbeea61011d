"""npud's configuration: a TOML file decoded into msgspec Structs.

Unknown keys and bad values are refused with the key's path in the message
(``unknown key daemon.sockt (did you mean socket?)``: config_errors). Keys
renamed since the last release are still accepted with a warning
(config_renames). Every key has a default, so an empty file (or none) is a valid
configuration; ``config/npud.toml`` lists them all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from npud.fastrpc.kernel import abi
from npud.ops.config_errors import explain
from npud.ops.config_renames import RenameConflictError, apply_renames

DEFAULT_SOCKET: Final = "/run/npud/npud.sock"
DEFAULT_CONFIG: Final = "/etc/npud/npud.toml"
DEFAULT_KERNEL_SHELL: Final = "/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
DEFAULT_KERNEL_PUBLIC_KEY: Final = "/etc/npud/shell-signing.pub"
DEFAULT_KERNEL_LIBRARY_PATH: Final = ("/usr/lib/dsp/cdsp", "/usr/lib/dsp", "/usr/lib/rfsa/adsp")

Backend = Literal["auto", "kernel", "emulator"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

_Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
_Bytes = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]
_Seconds = Annotated[float, msgspec.Meta(ge=0, le=3600)]
_Id = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]

MAX_BUFFER_SIZE: Final = 1 << 32
"""npu_protocol.MAX_BUFFER_SIZE, the wire's largest buffer (a test holds them equal):
choosing a profile loads no protocol code."""


def _doc(text: str) -> msgspec.Meta:
    """A key's description: npud.toml(5) is generated from these (scripts/generate_docs.py)."""
    return msgspec.Meta(description=text)


class DaemonConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The socket, logging and shutdown. A reload (SIGHUP) applies log_level; the rest
    needs a restart."""

    socket: Annotated[
        str, _doc("Listening socket, when systemd does not pass one (socket activation).")
    ] = DEFAULT_SOCKET
    socket_mode: Annotated[
        str,
        msgspec.Meta(pattern=r"^0?[0-7]{3}$"),
        _doc("Permission bits of the socket, octal, as a string."),
    ] = "0660"
    socket_group: Annotated[
        str,
        _doc(
            "Group that owns the socket; empty keeps the daemon's own group. Under systemd "
            "leave it empty: the socket unit sets the group (npu)."
        ),
    ] = ""
    log_format: Annotated[
        LogFormat,
        _doc(
            "auto: JSON lines when stderr is not a terminal (the journal, with syslog "
            "priority prefixes), readable text on a terminal."
        ),
    ] = "auto"
    log_level: Annotated[LogLevel, _doc("The least severe level that is logged.")] = "info"
    shutdown_grace_s: Annotated[
        _Seconds, _doc("Seconds that calls already running on the DSP get to finish at shutdown.")
    ] = 10.0
    hello_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        _doc("Seconds a new connection has to send its Hello before it is closed."),
    ] = 5.0
    max_handshakes: Annotated[
        int,
        msgspec.Meta(ge=1, le=100_000),
        _doc(
            "Connections that have not said Hello yet, all users together; more are refused "
            "at once. They are counted apart from clients, so sockets that connect and say "
            "nothing cannot shut clients out."
        ),
    ] = 64
    max_handshakes_per_uid: Annotated[
        int,
        msgspec.Meta(ge=1, le=100_000),
        _doc("Connections of one user that have not said Hello yet."),
    ] = 8
    frame_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        _doc("Seconds a welcomed client may leave a frame half sent before it is dropped."),
    ] = 10.0
    call_watchdog_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        _doc(
            "A DSP call still running after this many seconds is taken as hung: it is "
            "reported, the DSP process of its domain is ended and that domain's session "
            "restarted (the domain's clients are told; other domains see nothing), and its "
            "client pays (hung_call_penalty). 0 turns the watchdog off."
        ),
    ] = 30.0
    hung_call_penalty: Annotated[
        Literal["throttle", "revoke"],
        _doc(
            "What the client whose call the watchdog caught pays, beyond the restart of its "
            "domain's DSP process: throttle runs its calls one at a time in the background "
            "class for hung_call_throttle_s; revoke closes its connection at once."
        ),
    ] = "throttle"
    hung_call_throttle_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        _doc("Seconds a client stays throttled after a call of it hung."),
    ] = 60.0
    hung_calls_before_revoke: Annotated[
        int,
        msgspec.Meta(ge=0, le=1000),
        _doc(
            "A client whose calls hung this many times is revoked (its connection closed "
            "with NOT_PERMITTED), whatever hung_call_penalty says; 0 never revokes."
        ),
    ] = 2
    dropped_connections_before_refusal: Annotated[
        int,
        msgspec.Meta(ge=0, le=1000),
        _doc(
            "A user whose connections npud dropped for breaking the protocol (a fatal frame, "
            "too many stray fds, too many requests refused NOT_PERMITTED) this many times "
            "has its new connections refused (NOT_PERMITTED) for dropped_connection_penalty_s "
            "after the last drop; root and npud's own user are exempt; 0 never refuses."
        ),
    ] = 3
    dropped_connection_penalty_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        _doc("Seconds a dropped connection counts against its user."),
    ] = 60.0
    refused_requests_before_drop: Annotated[
        int,
        msgspec.Meta(ge=0, le=1_000_000),
        _doc(
            "A connection whose requests were refused NOT_PERMITTED this many times is "
            "dropped for breaking the protocol (and counts against its user); 0 never drops."
        ),
    ] = 64
    log_burst: Annotated[
        int,
        msgspec.Meta(ge=1, le=1_000_000),
        _doc(
            "Lines one connection may log about its refused requests and stray fds before "
            "the rest are counted and summed up in one line every log_summary_interval_s."
        ),
    ] = 20
    log_summary_interval_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        _doc("Seconds between the summary lines of a connection whose lines are held back."),
    ] = 10.0
    model_check_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        _doc(
            "Seconds the checks of one model file may take (its kind, external data, loops, "
            "shapes: a walk of its protobuf fields, on a thread of the load's own); a file "
            "that takes longer is refused MODEL_REJECTED. Real models take milliseconds; a "
            "file of millions of tiny fields takes seconds."
        ),
    ] = 10.0
    trace: Annotated[
        str,
        _doc(
            "Record every FastRPC driver call, session operation and reverse-RPC call to this "
            "file (docs/trace-format.md); empty records nothing. The trace holds the bytes of "
            "buffers and of the files the DSP reads: keep it private. --trace overrides it."
        ),
    ] = ""

    @property
    def socket_mode_bits(self) -> int:
        return int(self.socket_mode, 8)


class BackendConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The driver npud runs on: the kernel's FastRPC device, or the built-in emulator.
    Changes need a restart."""

    kind: Annotated[
        Backend,
        _doc(
            "auto uses the kernel driver where a device node exists and the emulator "
            "otherwise; kernel fails without a device (--backend overrides this key)."
        ),
    ] = "auto"
    nodes: Annotated[
        tuple[str, ...],
        _doc("Device nodes to try, in order (libcdsprpc's order: the secure node first)."),
    ] = abi.CDSP_NODES
    library_path: Annotated[
        tuple[str, ...],
        _doc(
            "Directories the DSP may load skel libraries from, served through reverse RPC. "
            "Empty: /usr/lib/dsp/cdsp, /usr/lib/dsp and /usr/lib/rfsa/adsp on the device; "
            "the emulator's own skel directory on the emulator."
        ),
    ] = ()


class ShellConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The DSP shell npud verifies (SHA-256 and an Ed25519 signature, fail-closed) and
    loads. Changes need a restart."""

    path: Annotated[
        str,
        _doc(
            "The DSP shell. Empty: /usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3 on the device; "
            "the development shell that ships with npud on the emulator. PATH.sha256 and "
            "PATH.sig sit beside it."
        ),
    ] = ""
    public_key: Annotated[
        str,
        _doc(
            "File with the Ed25519 public key (64 hex characters or PEM). Empty: "
            "/etc/npud/shell-signing.pub on the device; the development key on the emulator. "
            "The kernel backend refuses the development key."
        ),
    ] = ""
    trusted_uids: Annotated[
        tuple[_Id, ...],
        _doc("Owners allowed for the shell, its .sha256 and .sig, and the key file."),
    ] = (0,)


class AccessConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Who may connect and who may have the realtime class, checked with SO_PEERCRED.
    A reload (SIGHUP) applies changes without dropping clients."""

    allow_uids: Annotated[
        tuple[_Id, ...],
        _doc(
            "Users allowed to connect, besides root and the daemon's own user. Under "
            "systemd the socket's group (npu) already limits who can reach the socket."
        ),
    ] = ()
    allow_gids: Annotated[
        tuple[_Id, ...],
        _doc("Groups whose members may connect: primary or supplementary (usermod -aG)."),
    ] = ()
    realtime_uids: Annotated[
        tuple[_Id, ...],
        _doc(
            "Users who may be granted the realtime class (voice), besides root and the "
            "daemon's own user; anyone else asking for it gets normal. A reload that takes "
            "a user off demotes its live realtime connections."
        ),
    ] = ()
    realtime_gids: Annotated[
        tuple[_Id, ...],
        _doc("Groups (primary or supplementary) whose members may be granted realtime."),
    ] = ()
    realtime_groups: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")], ...],
        _doc(
            "Groups, by name, whose members may be granted realtime (sysusers.d makes "
            "npu-realtime: add the voice service's user to it). A name the system does "
            "not know matches no one."
        ),
    ] = ("npu-realtime",)


MAX_TIMEOUT_MS: Final = 600_000
"""The ``max_timeout_ms`` every Welcome announces."""


class ClientLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits per connection, announced in its Welcome. A reload (SIGHUP) applies changes
    without dropping clients."""

    max_buffers: Annotated[_Count, _doc("DMA-BUFs one client may hold.")] = 256
    max_buffer_bytes: Annotated[
        _Bytes,
        _doc(
            "Bytes of DMA-BUFs one client may hold: a 4 GiB model's weights in llama.cpp's "
            "default 1 GiB chunks."
        ),
    ] = 4 << 30
    max_buffer_size: Annotated[
        int,
        msgspec.Meta(ge=4096, le=MAX_BUFFER_SIZE),
        _doc(
            "Bytes: the largest single buffer a client may allocate (at most 4 GiB). "
            "llama.cpp asks for its chunk (GGML_HEXAGON_MBUF, default 1 GiB) plus a 4 KiB "
            "guard page, rounded up to 2 MiB on DSPs newer than v79, and a tensor larger "
            "than the chunk in a buffer of its own."
        ),
    ] = 2 << 30
    max_handles: Annotated[_Count, _doc("Remote handles one client may have open.")] = 32
    max_models: Annotated[_Count, _doc("Models one client may have loaded at once.")] = 8
    max_model_bytes: Annotated[
        _Bytes,
        _doc("Bytes of models one client may hold: each model's file size plus its tensor arena."),
    ] = 1 << 30
    max_calls_in_flight: Annotated[
        int,
        msgspec.Meta(ge=1, le=0xFFFF),
        _doc("Requests a client may have unanswered; invokes beyond it are refused."),
    ] = 16
    default_timeout_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=MAX_TIMEOUT_MS / 1000),
        _doc(
            "Seconds: the timeout of invokes that carry none, announced in the Welcome (in "
            "milliseconds); 0 waits for the DSP. At most 600, the largest timeout a client "
            "may ask for."
        ),
    ] = 0.0


class DaemonLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits for the whole daemon. A reload (SIGHUP) applies changes without dropping
    clients."""

    max_clients: Annotated[_Count, _doc("Connections at once.")] = 64
    max_buffers: Annotated[_Count, _doc("DMA-BUFs held for all clients together.")] = 4096
    max_buffer_bytes: Annotated[
        _Bytes,
        _doc("Bytes of DMA-BUFs and of loaded models (files and arenas) held for all clients."),
    ] = 8 << 30


class SchedulerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How DSP-bound calls share the NPU (docs/scheduling.md). Changes need a restart."""

    mode: Annotated[
        Literal["fair", "fifo"],
        _doc(
            "fair: classes, deadlines, fair share by DSP time, realtime reserve; fifo: "
            "arrival order with no policy (to measure what the policy buys)."
        ),
    ] = "fair"
    dsp_slots: Annotated[
        int, msgspec.Meta(ge=1, le=64), _doc("Calls npud keeps on the DSP at once.")
    ] = 4
    realtime_reserve: Annotated[
        int,
        msgspec.Meta(ge=0, le=63),
        _doc(
            "Slots kept for realtime calls: lent to a normal or background call only when"
            " its client's typical call ends before a realtime client would need the slot"
            " (docs/scheduling.md)."
        ),
    ] = 1
    background_max: Annotated[
        int,
        msgspec.Meta(ge=1, le=64),
        _doc("Background calls on the DSP at once, at most, while a normal call waits."),
    ] = 2
    background_wait_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=60),
        _doc("Seconds: a background call that has waited this long goes before normal calls."),
    ] = 0.5
    per_client_running: Annotated[
        int, msgspec.Meta(ge=1, le=64), _doc("Calls of one client on the DSP at once, at most.")
    ] = 2
    batches: Annotated[
        Literal["gated", "counted"],
        _doc(
            "dspqueue op batches (llama.cpp): 'gated', a doorbell is dispatched as a call of "
            "its client's class and its batch holds the slot until the answer; a background "
            "client's doorbell also waits while realtime work runs or is due (at most "
            "batch_hold_max_s). 'counted': doorbells pass at once, as plain calls; either way "
            "doorbell-to-answer is charged to the client as DSP time (docs/scheduling.md)."
        ),
    ] = "gated"
    batch_hold_max_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=10),
        _doc("Seconds a background client's batch may be held for realtime work, at most."),
    ] = 0.05
    batch_answer_max_s: Annotated[
        float,
        msgspec.Meta(ge=0.01, le=600),
        _doc(
            "Seconds a batch keeps its slot waiting for its answer; past it the slot is "
            "given back (logged) and the time charged."
        ),
    ] = 2.0
    realtime_utilisation_pct: Annotated[
        int,
        msgspec.Meta(ge=1, le=100),
        _doc("Realtime budgets declared at hello are admitted up to this share of the DSP."),
    ] = 50
    realtime_utilisation_per_uid_pct: Annotated[
        int,
        msgspec.Meta(ge=1, le=100),
        _doc(
            "The share of the DSP the realtime budgets of one user's connections may take "
            "together, so one user cannot shut another's voice client out."
        ),
    ] = 25
    realtime_default_budget_s: Annotated[
        float,
        msgspec.Meta(ge=0.000_001, le=10),
        _doc(
            "A realtime client that declares no budget is admitted as though it declared "
            "this many seconds of DSP time every realtime_default_period_s (beyond it, its "
            "calls run as normal)."
        ),
    ] = 0.004
    realtime_default_period_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=10),
        _doc("The period of that default budget, in seconds."),
    ] = 0.032
    workers: Annotated[
        int,
        msgspec.Meta(ge=0, le=256),
        _doc("Threads of the data path (they read requests and run DSP calls); 0: dsp_slots + 2."),
    ] = 0

    def __post_init__(self) -> None:
        if self.realtime_reserve >= self.dsp_slots:
            raise ValueError(
                f"realtime_reserve {self.realtime_reserve} leaves no slot of {self.dsp_slots} "
                "for normal and background calls"
            )
        if self.realtime_default_budget_s > self.realtime_default_period_s:
            raise ValueError(
                f"realtime_default_budget_s {self.realtime_default_budget_s} is longer than "
                f"its period, realtime_default_period_s {self.realtime_default_period_s}"
            )

    @property
    def worker_threads(self) -> int:
        return self.workers or self.dsp_slots + 2


class EmulatorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The built-in emulator (backend.kind = emulator, or auto without a device). Changes
    need a restart."""

    dsp_units: Annotated[
        int,
        msgspec.Meta(ge=0, le=64),
        _doc(
            "The emulated DSP's HVX contexts, shared by its calls and by every DSP "
            "process's own work (llama.cpp's op batches): with n pieces of work running "
            "each runs at min(1, units / n) of full speed, as on a real NPU. 0: every piece "
            "runs as if alone."
        ),
    ] = 0
    hmx_units: Annotated[
        int,
        msgspec.Meta(ge=0, le=8),
        _doc(
            "The emulated DSP's HMX matrix units (1 on the device): matrix work (a model's "
            "graph, an op batch with matrix products) shares them besides an HVX context. "
            "0: not modelled."
        ),
    ] = 0
    pd_isolation: Annotated[
        Literal["process", "thread"],
        _doc(
            "Where each emulated DSP process runs its skels and models: 'process', in a "
            "child process of its own (unprivileged, an empty working directory; a looping "
            "model burns only that child), or 'thread', on npud's own threads (faster calls, "
            "no confinement: for profiling the daemon)."
        ),
    ] = "process"
    pd_user: Annotated[
        str,
        msgspec.Meta(min_length=1, max_length=32),
        _doc("The user the DSP processes' children run as when npud runs as root."),
    ] = "nobody"
    pd_memory_limit: Annotated[
        _Bytes,
        _doc(
            "Bytes of private memory each DSP process's child may take (RLIMIT_DATA: its "
            "heap and private mappings; the buffers it maps from npud are not counted). A "
            "child that needs more ends as a crashed DSP process does: its domain restarts "
            "and its clients are told (DSP_RESTARTED), npud and other domains see nothing. "
            "0: no limit. pd_isolation = 'thread' has none."
        ),
    ] = 4 << 30
    dma_heap: Annotated[
        bool,
        _doc(
            "Emulate the system DMA-BUF heap (/dev/dma_heap/system). false: buffers come "
            "from the FastRPC driver's ALLOC_DMA_BUFF, as on a kernel without the heap."
        ),
    ] = True
    unsigned_pd_support: Annotated[
        bool,
        _doc(
            "The emulated DSP runs unsigned PDs (capability UNSIGNED_PD_SUPPORT). false: a "
            "firmware without them, which npud refuses to ask for one (docs/hardware.md)."
        ),
    ] = True
    domain_handles: Annotated[
        bool,
        _doc(
            "The emulated DSP has adsp_listener1 and remotectl1 (static handles 7 and 8). "
            "false: an older firmware, whose absent handles answer absent_module_result."
        ),
    ] = True
    absent_module_result: Annotated[
        int,
        msgspec.Meta(ge=1, le=0xFFFFFFFF),
        _doc(
            "What the emulated DSP answers for a static handle it lacks (a non-zero u32): "
            "AEE_ENOSUCHMOD 0x8000043E by default; AEE_ERPC is 0x80000600."
        ),
    ] = 0x8000043E
    fault_uids: Annotated[
        tuple[_Id, ...],
        _doc(
            "Users, besides root, whose calls may run the emulated skels' fault-injecting "
            "methods (npu_test.fault: the DSP process crashes and its domain restarts); "
            "anyone else's are refused (NOT_PERMITTED). Long calls (npu_test.busy) stay "
            "open to all."
        ),
    ] = ()
    loader_probes: Annotated[
        tuple[str, ...],
        _doc(
            "Files the emulated DSP's loader asks the host for before a process's first "
            "library (libcdsprpc expects oemconfig.so, testsig, librpcversion_skel.so); each "
            "must be served or answered ENOENT, as on a loader that goes on only after ENOENT."
        ),
    ] = ()


PoolShare = Literal["client", "user"]


class PoolConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The buffer pool: DMA-BUFs that clients free are kept, zeroed, and handed to the next
    allocation of the same size, so it skips the allocation and the pages are already in
    place. A reload (SIGHUP) applies changes; what no longer fits is released."""

    enabled: Annotated[bool, _doc("Keep freed buffers for reuse; false releases each at once.")] = (
        True
    )
    share: Annotated[
        PoolShare,
        _doc(
            "Who may get a buffer another freed. client: only the connection that freed it "
            "(its buffers are released when it disconnects). user: any connection of the same "
            "uid. A process can keep its fd or mapping of a buffer after freeing it and npud "
            "cannot revoke either, so with user a process that does so sees what the next "
            "holder of its uid writes there; client confines that to the process itself."
        ),
    ] = "client"
    max_bytes: Annotated[
        _Bytes,
        _doc(
            "Bytes of buffers kept at most, on top of what clients hold; the buffers kept "
            "longest are released first to make room."
        ),
    ] = 256 << 20
    max_buffer_bytes: Annotated[
        _Bytes, _doc("Larger buffers are never kept: they are released when freed.")
    ] = 64 << 20
    idle_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=86_400),
        _doc("Seconds: a kept buffer that no allocation took for this long is released."),
    ] = 30.0
    keep_dsp_mappings: Annotated[
        bool,
        _doc(
            "A kept buffer stays mapped into the DSP (map answers its address without a new "
            "mapping); false unmaps it when it is freed. Either way a DSP restart drops every "
            "kept buffer."
        ),
    ] = True


class UidLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits per user (all connections of one uid together), so one user cannot take what
    the daemon has for everyone. A reload (SIGHUP) applies changes without dropping
    clients."""

    max_clients: Annotated[_Count, _doc("Connections of one user at once.")] = 16
    max_buffers: Annotated[_Count, _doc("DMA-BUFs held for one user.")] = 2048
    max_buffer_bytes: Annotated[
        _Bytes,
        _doc(
            "Bytes of DMA-BUFs and of loaded models (files and arenas) held for one user: "
            "half the daemon's, by default."
        ),
    ] = 4 << 30
    max_handles: Annotated[_Count, _doc("Remote handles one user may have open.")] = 256
    max_models: Annotated[_Count, _doc("Models one user's connections may have loaded.")] = 16
    max_loads_in_flight: Annotated[
        _Count,
        _doc(
            "Model loads of one user in flight at once (a domain's loader takes users in "
            "turns; this bounds how many one user queues)."
        ),
    ] = 2
    max_fds_waiting: Annotated[
        _Count,
        _doc(
            "Fds one user's connections sent that npud has yet to close (stray fds, model "
            "files): a close can block, so they are closed on a thread of the user's own; "
            "past this many waiting, the connection that sends more is dropped "
            "(QUOTA_EXCEEDED)."
        ),
    ] = 64


DomainShare = Literal["uid", "all"]

DomainName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[a-z][a-z0-9_-]{0,30}$"),
    _doc("Lower-case letters, digits, - and _, starting with a letter; at most 31."),
]
DEFAULT_DOMAIN: Final = "default"
X1E_COMPUTE_CONTEXT_BANKS: Final = 12
"""Compute context banks of the X1E80100 CDSP's FastRPC node in the device tree
(x1e80100.dtsi: SIDs 1-8 and 10-13, "cb 9 is secure"); one per DSP process."""


class DomainRuleConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A named domain and the connections it takes (``[[domains.rule]]``)."""

    name: Annotated[DomainName, _doc("The domain's name, as status shows it.")]
    uids: Annotated[tuple[_Id, ...], _doc("Connections of these users.")] = ()
    gids: Annotated[
        tuple[_Id, ...],
        _doc("Connections of users in these groups (primary or supplementary)."),
    ] = ()
    clients: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=127)], ...],
        _doc(
            "Connections whose Hello client_name matches one of these shell patterns "
            "(fnmatch). A name is the client's own claim: combine it with uids or gids "
            "where that matters."
        ),
    ] = ()
    isolate: Annotated[
        bool,
        _doc(
            "Each matching connection gets a DSP process of its own, opened at its Hello "
            "and closed when it goes; false: the matching connections share one."
        ),
    ] = False
    share: Annotated[
        DomainShare,
        _doc(
            "uid: each user's matching connections share a DSP process of that user's own, "
            "NAME@UID (root's and npud's own user's: NAME); all: every matching user shares "
            "one, NAME, and DSP code of each reaches the buffers the others map there "
            "(docs/deploy.md, Sharing a DSP process)."
        ),
    ] = "uid"

    def __post_init__(self) -> None:
        if self.name == DEFAULT_DOMAIN:
            raise ValueError(f"{DEFAULT_DOMAIN!r} is the domain of connections no rule takes")
        if not (self.uids or self.gids or self.clients):
            raise ValueError(f"domain {self.name!r} names no uids, gids or clients to take")


DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS: Final = 128
"""Half of the CDSP's 255 contexts: other programs on the CDSP leak theirs too."""


class DomainsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Domains: which connections share a DSP process (docs/architecture.md, Domains).
    A connection joins the first rule whose every listed kind (uids, gids, clients)
    matches it, else the default domain. A reload (SIGHUP) applies to connections that
    say Hello afterwards."""

    max_domains: Annotated[
        int,
        msgspec.Meta(ge=1, le=14),
        _doc(
            "DSP processes npud keeps at once, the default domain's included: one FastRPC "
            "session each, and each takes one of the CDSP's compute context banks (12 on "
            "the X1E80100). A connection that would need one more is refused "
            "(QUOTA_EXCEEDED)."
        ),
    ] = X1E_COMPUTE_CONTEXT_BANKS
    max_domains_per_uid: Annotated[
        int,
        msgspec.Meta(ge=1, le=14),
        _doc(
            "DSP processes one user's connections may hold at once (its default@UID and "
            "named@UID domains and its isolated ones), so one user cannot take every context "
            "bank; one more is refused (QUOTA_EXCEEDED, naming the uid). Root and npud's own "
            "user are not bound by it."
        ),
    ] = 4
    isolate_default: Annotated[
        bool,
        _doc(
            "Connections that no rule takes get a DSP process each, instead of sharing their "
            "user's default domain."
        ),
    ] = False
    share_default: Annotated[
        bool,
        _doc(
            "Connections of every user that no rule takes share one DSP process, default, "
            "as npud did before: DSP code of each reaches the buffers every other maps there "
            "(docs/deploy.md, Sharing a DSP process). false: each user gets its own, "
            "default@UID, and root and npud's own user share default."
        ),
    ] = False
    rule: Annotated[tuple[DomainRuleConfig, ...], _doc("The named domains, first match wins.")] = ()
    allow_isolate: Annotated[
        bool,
        _doc(
            "A client may ask for a DSP process of its own at its Hello (isolate, protocol "
            "version 4; npud's libcdsprpc does, for dspqueue); false refuses such a Hello."
        ),
    ] = True
    user_domain_linger_s: Annotated[
        float,
        msgspec.Meta(ge=0.0, le=3600.0),
        _doc(
            "Seconds a user's own domain (default@UID, NAME@UID) is kept open after its last "
            "connection goes: a connection of that user within them joins it, instead of "
            "npud starting a DSP process again (a client that connects and disconnects in a "
            "loop would otherwise start and stop one each time). It still counts against "
            "max_domains and max_domains_per_uid meanwhile. 0 closes it at once. Isolated "
            "domains close with their connection."
        ),
    ] = 2.0
    reopen_at_interrupted_contexts: Annotated[
        int,
        msgspec.Meta(ge=1, le=254),
        _doc(
            "A system suspend interrupts every call waiting for the DSP (each session's "
            "listener, each dspqueue wait), and mainline's fastrpc keeps each interrupted "
            "call's context until its fd closes: the CDSP has 255 for every program. When "
            "npud's sessions hold this many together, npud reopens the sessions holding "
            "the most (their clients see a DSP restart) until they hold half as many."
        ),
    ] = DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS

    def __post_init__(self) -> None:
        names = [rule.name for rule in self.rule]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"domain names must differ: {', '.join(twice)} given twice")


class Config(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """npud's configuration: one TOML table per section below."""

    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    backend: BackendConfig = msgspec.field(default_factory=BackendConfig)
    shell: ShellConfig = msgspec.field(default_factory=ShellConfig)
    access: AccessConfig = msgspec.field(default_factory=AccessConfig)
    client_limits: ClientLimitsConfig = msgspec.field(default_factory=ClientLimitsConfig)
    limits: DaemonLimitsConfig = msgspec.field(default_factory=DaemonLimitsConfig)
    uid_limits: UidLimitsConfig = msgspec.field(default_factory=UidLimitsConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    emulator: EmulatorConfig = msgspec.field(default_factory=EmulatorConfig)
    pool: PoolConfig = msgspec.field(default_factory=PoolConfig)
    domains: DomainsConfig = msgspec.field(default_factory=DomainsConfig)


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the key."""


Warn = Callable[[str], None]
"""Where the lines about renamed keys go (config_renames): each names the new key."""


def warn_on_stderr(line: str) -> None:
    print(f"npud: warning: {line}", file=sys.stderr)


def parse_config(text: str, *, source: str = "<config>", warn: Warn = warn_on_stderr) -> Config:
    """``text`` as a Config; old key names are moved to their new ones, with a ``warn``
    line each (prefixed with ``source``)."""
    try:
        raw = msgspec.toml.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        apply_renames(raw, lambda line: warn(f"{source}: {line}"))
        return msgspec.convert(raw, type=Config)
    except RenameConflictError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {explain(exc, Config)}") from None


def load_config(path: str | os.PathLike[str] | None, *, warn: Warn = warn_on_stderr) -> Config:
    """Read ``path``; None means the default file if it exists, else all defaults."""
    if path is None:
        default = Path(DEFAULT_CONFIG)
        if not default.exists():
            return Config()
        path = default
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_config(text, source=str(path), warn=warn)

"""npud.toml's sections on what may be held: ``[client_limits]`` (per connection,
announced in its Welcome), ``[limits]`` (the daemon's totals), ``[uid_limits]``
(per user) and ``[pool]`` (the freed buffers kept for reuse)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from npud.ops.config_values import Bytes, Count, doc

MAX_BUFFER_SIZE: Final = 1 << 32
"""npu_protocol.MAX_BUFFER_SIZE, the wire's largest buffer (a test holds them equal):
choosing a profile loads no protocol code."""

MAX_TIMEOUT_MS: Final = 600_000
"""The ``max_timeout_ms`` every Welcome announces."""


class ClientLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits per connection, announced in its Welcome. A reload (SIGHUP) applies changes
    without dropping clients."""

    max_buffers: Annotated[Count, doc("DMA-BUFs one client may hold.")] = 256
    max_buffer_bytes: Annotated[
        Bytes,
        doc(
            "Bytes of DMA-BUFs one client may hold: a 4 GiB model's weights in llama.cpp's "
            "default 1 GiB chunks."
        ),
    ] = 4 << 30
    max_buffer_size: Annotated[
        int,
        msgspec.Meta(ge=4096, le=MAX_BUFFER_SIZE),
        doc(
            "Bytes: the largest single buffer a client may allocate (at most 4 GiB). "
            "llama.cpp asks for its chunk (GGML_HEXAGON_MBUF, default 1 GiB) plus a 4 KiB "
            "guard page, rounded up to 2 MiB on DSPs newer than v79, and a tensor larger "
            "than the chunk in a buffer of its own."
        ),
    ] = 2 << 30
    max_handles: Annotated[Count, doc("Remote handles one client may have open.")] = 32
    max_models: Annotated[Count, doc("Models one client may have loaded at once.")] = 8
    max_model_bytes: Annotated[
        Bytes,
        doc("Bytes of models one client may hold: each model's file size plus its tensor arena."),
    ] = 1 << 30
    max_calls_in_flight: Annotated[
        int,
        msgspec.Meta(ge=1, le=0xFFFF),
        doc("Requests a client may have unanswered; invokes beyond it are refused."),
    ] = 16
    default_timeout_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=MAX_TIMEOUT_MS / 1000),
        doc(
            "Seconds: the timeout of invokes that carry none, announced in the Welcome (in "
            "milliseconds); 0 waits for the DSP. At most 600, the largest timeout a client "
            "may ask for."
        ),
    ] = 0.0


class DaemonLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits for the whole daemon. A reload (SIGHUP) applies changes without dropping
    clients."""

    max_clients: Annotated[Count, doc("Connections at once.")] = 64
    max_buffers: Annotated[Count, doc("DMA-BUFs held for all clients together.")] = 4096
    max_buffer_bytes: Annotated[
        Bytes,
        doc("Bytes of DMA-BUFs and of loaded models (files and arenas) held for all clients."),
    ] = 8 << 30


PoolShare = Literal["client", "user"]


class PoolConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The buffer pool: DMA-BUFs that clients free are kept, zeroed, and handed to the next
    allocation of the same size, so it skips the allocation and the pages are already in
    place. A reload (SIGHUP) applies changes; what no longer fits is released."""

    enabled: Annotated[bool, doc("Keep freed buffers for reuse; false releases each at once.")] = (
        True
    )
    share: Annotated[
        PoolShare,
        doc(
            "Who may get a buffer another freed. client: only the connection that freed it "
            "(its buffers are released when it disconnects). user: any connection of the same "
            "uid. A process can keep its fd or mapping of a buffer after freeing it and npud "
            "cannot revoke either, so with user a process that does so sees what the next "
            "holder of its uid writes there; client confines that to the process itself."
        ),
    ] = "client"
    max_bytes: Annotated[
        Bytes,
        doc(
            "Bytes of buffers kept at most, on top of what clients hold; the buffers kept "
            "longest are released first to make room."
        ),
    ] = 256 << 20
    max_buffer_bytes: Annotated[
        Bytes, doc("Larger buffers are never kept: they are released when freed.")
    ] = 64 << 20
    idle_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=86_400),
        doc("Seconds: a kept buffer that no allocation took for this long is released."),
    ] = 30.0
    keep_dsp_mappings: Annotated[
        bool,
        doc(
            "A kept buffer stays mapped into the DSP (map answers its address without a new "
            "mapping); false unmaps it when it is freed. Either way a DSP restart drops every "
            "kept buffer."
        ),
    ] = True


class UidLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Limits per user (all connections of one uid together), so one user cannot take what
    the daemon has for everyone. A reload (SIGHUP) applies changes without dropping
    clients."""

    max_clients: Annotated[Count, doc("Connections of one user at once.")] = 16
    max_buffers: Annotated[Count, doc("DMA-BUFs held for one user.")] = 2048
    max_buffer_bytes: Annotated[
        Bytes,
        doc(
            "Bytes of DMA-BUFs and of loaded models (files and arenas) held for one user: "
            "half the daemon's, by default."
        ),
    ] = 4 << 30
    max_handles: Annotated[Count, doc("Remote handles one user may have open.")] = 256
    max_models: Annotated[Count, doc("Models one user's connections may have loaded.")] = 16
    max_loads_in_flight: Annotated[
        Count,
        doc(
            "Model loads of one user in flight at once (a domain's loader takes users in "
            "turns; this bounds how many one user queues)."
        ),
    ] = 2
    max_fds_waiting: Annotated[
        Count,
        doc(
            "Fds one user's connections sent that npud has yet to close (stray fds, model "
            "files): a close can block, so they are closed on a thread of the user's own; "
            "past this many waiting, the connection that sends more is dropped "
            "(QUOTA_EXCEEDED)."
        ),
    ] = 64

"""Every request kind, once: its argument checks, its request, what its answer becomes.

Each function here checks the caller's arguments (raising before anything is
sent) and returns a :class:`~npu_client._core.Call`. The blocking and the
trio client run a Call the same way (``client._run(call)``, awaited or not),
so a new request kind (models: load, run, unload) is one function here and a
one-line method on each client.

``finish`` runs with the answer in: it raises the error the daemon gave (or
tolerates the ones that mean "already done"), updates the local objects (a
buffer's DSP mapping, its release, a handle's state) and returns the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from npu_client._args import (
    InvokeInput,
    InvokeOutput,
    check_ping_payload,
    check_size,
    check_uri,
    invoke_request,
)
from npu_client._core import Call, ClientCore, Pending
from npu_client._errors import ConnectionClosedError, DspRestarted
from npu_client._memory import MappedBuffer
from npu_client._views import HandleIdentity
from npu_client.transport import OwnedFd
from npu_protocol import (
    AllocReply,
    AllocRequest,
    CloseRequest,
    DaemonStatus,
    FreeReply,
    FreeRequest,
    InvokeReply,
    MapReply,
    MapRequest,
    OpenReply,
    OpenRequest,
    PingRequest,
    PongReply,
    StatusReply,
    StatusRequest,
    UnmapReply,
    UnmapRequest,
)

# --- buffers ----------------------------------------------------------------------------------


class Allocation(NamedTuple):
    """An answered alloc: the caller maps ``fd`` (which it now owns) and adopts the buffer."""

    buffer: int
    size: int
    fd: OwnedFd
    epoch: int


def alloc(size: object) -> Call[Allocation]:
    size = check_size(size)

    def finish(pending: Pending) -> Allocation:
        reply = pending.result(AllocReply)
        return Allocation(reply.buffer, reply.size, pending.take_fd(), pending.epoch)

    return Call(lambda rid: AllocRequest(id=rid, size=size), finish)


def free(core: ClientCore[Any], buffer: MappedBuffer) -> Call[None]:
    """Release ``buffer`` in the daemon, then here. A connection that is over has
    released it already: not an error. Other errors leave it as it was."""

    def finish(pending: Pending) -> None:
        if pending.error is not None and not isinstance(pending.error, ConnectionClosedError):
            raise pending.error
        core.forget(buffer)
        buffer._release_local()

    return Call(lambda rid: FreeRequest(id=rid, buffer=buffer.id), finish)


def discard(buffer_id: int) -> Call[None]:
    """Free a buffer this side could not map (there is nothing to release here)."""
    return Call(lambda rid: FreeRequest(id=rid, buffer=buffer_id), _freed)


def _freed(pending: Pending) -> None:
    pending.result(FreeReply)


def map_buffer(buffer: MappedBuffer) -> Call[int]:
    buffer._memory()  # refuse a freed buffer before asking

    def finish(pending: Pending) -> int:
        address = pending.result(MapReply).dsp_address
        buffer._remember_mapping(address)
        return address

    return Call(lambda rid: MapRequest(id=rid, buffer=buffer.id), finish)


def unmap_buffer(buffer: MappedBuffer) -> Call[None]:
    def finish(pending: Pending) -> None:
        pending.result(UnmapReply)
        buffer._forget_mapping()

    return Call(lambda rid: UnmapRequest(id=rid, buffer=buffer.id), finish)


# --- skels --------------------------------------------------------------------------------------


class OpenedHandle(NamedTuple):
    """An answered open: what the caller's RemoteHandle is made of."""

    handle: int
    uri: str
    epoch: int


def open_skel(core: ClientCore[Any], uri: object) -> Call[OpenedHandle]:
    uri = check_uri(uri)
    epoch = core.epoch  # a restart answered before the reply closes it in the daemon

    def finish(pending: Pending) -> OpenedHandle:
        return OpenedHandle(pending.result(OpenReply).handle, uri, epoch)

    return Call(lambda rid: OpenRequest(id=rid, uri=uri), finish)


def close_skel(handle: HandleIdentity) -> Call[None]:
    """Close ``handle`` on the DSP. Gone with the connection or a DSP restart: not an error."""

    def finish(pending: Pending) -> None:
        if pending.error is not None and not isinstance(
            pending.error, ConnectionClosedError | DspRestarted
        ):
            raise pending.error
        handle._mark_closed()

    return Call(lambda rid: CloseRequest(id=rid, handle=handle.id), finish)


def invoke(
    core: ClientCore[Any],
    handle: HandleIdentity,
    method: int | None,
    inputs: Sequence[InvokeInput],
    outputs: Sequence[InvokeOutput],
    sc: int | None,
    timeout: float | None,
    deadline: float | None = None,
) -> Call[list[bytes | None]]:
    if handle._closed:
        handle._check_open()  # raises
    build = invoke_request(
        handle._id,
        method,
        sc,
        inputs,
        outputs,
        timeout,
        core.limits,
        core.owns,
        deadline,
        core.protocol_version,
    )
    return Call(build, _invoke_outputs)


def _invoke_outputs(pending: Pending) -> list[bytes | None]:
    return list(pending.result(InvokeReply).outputs)


# --- the daemon ------------------------------------------------------------------------------


def status() -> Call[DaemonStatus]:
    return Call(lambda rid: StatusRequest(id=rid), _status)


def _status(pending: Pending) -> DaemonStatus:
    return pending.result(StatusReply).status


def ping(payload: object) -> Call[bytes]:
    data = check_ping_payload(payload)
    return Call(lambda rid: PingRequest(id=rid, payload=data), _pong)


def _pong(pending: Pending) -> bytes:
    return pending.result(PongReply).payload

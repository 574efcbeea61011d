"""Every request kind, once: its argument checks, its request, what its answer becomes.

Each function here checks the caller's arguments (raising before anything is
sent) and returns a :class:`~npu_client._core.Call`. The blocking and the
trio client run a Call the same way (``client._run(call)``, awaited or not),
so a new request kind is one function here and a one-line method on each
client.

``finish`` runs with the answer in: it raises the error the daemon gave (or
tolerates the ones that mean "already done"), updates the local objects (a
buffer's DSP mapping, its release, a handle's state) and returns the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import msgspec

from npu_client._args import (
    InvokeInput,
    InvokeOutput,
    call_timing,
    check_ping_payload,
    check_size,
    check_uri,
    invoke_request,
    largest_buffer,
)
from npu_client._core import Call, ClientCore, Pending
from npu_client._errors import (
    ConnectionClosedError,
    DspRestarted,
    ModelNotLoaded,
    Unsupported,
    code_message,
)
from npu_client._memory import MappedBuffer
from npu_client._models import ModelState
from npu_client._views import HandleIdentity
from npu_client.transport import OwnedFd
from npu_protocol import (
    SINCE,
    AllocReply,
    AllocRequest,
    CloseRequest,
    DaemonStatus,
    DebugReply,
    DebugRequest,
    ErrorCode,
    Feature,
    FreeReply,
    FreeRequest,
    InvokeReply,
    MapReply,
    MapRequest,
    ModelConstant,
    ModelInfo,
    ModelInfoReply,
    ModelInfoRequest,
    ModelLoadReply,
    ModelLoadRequest,
    ModelRunReply,
    ModelRunRequest,
    ModelUnloadReply,
    ModelUnloadRequest,
    OpenReply,
    OpenRequest,
    PingRequest,
    PongReply,
    StatusReply,
    StatusRequest,
    UnmapReply,
    UnmapRequest,
    speaks,
)

# --- buffers ----------------------------------------------------------------------------------


class Allocation(NamedTuple):
    """An answered alloc: the caller maps ``fd`` (which it now owns) and adopts the buffer."""

    buffer: int
    size: int
    fd: OwnedFd
    epoch: int


def alloc(core: ClientCore[Any], size: object) -> Call[Allocation]:
    """At most the largest buffer the daemon announced (ValueError before sending)."""
    size = check_size(size, largest_buffer(core.limits))

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
        buffer._release_local(kept=core.kept_mappings, terms=core.own_pool)

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


# --- models -----------------------------------------------------------------------------------


class LoadedModel(NamedTuple):
    """An answered model_load: the caller maps ``fd`` (which it now owns) as the arena."""

    model: int
    info: ModelInfo
    fd: OwnedFd
    epoch: int


def load_model(
    core: ClientCore[Any],
    fd: int,
    name: str,
    shapes: dict[str, tuple[int, ...]],
    constants: dict[str, ModelConstant] | None = None,
    sizes: dict[str, tuple[tuple[int, ...], ...]] | None = None,
) -> Call[LoadedModel]:
    """Load the model file open on ``fd`` (sent with the request; it stays the caller's)."""
    if not speaks(core.protocol_version, Feature.MODELS):
        what = (
            f"models (npud speaks protocol version {core.protocol_version};"
            f" they need {SINCE[Feature.MODELS]})"
        )
        raise Unsupported(code_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})

    def finish(pending: Pending) -> LoadedModel:
        reply = pending.result(ModelLoadReply)
        return LoadedModel(reply.model, reply.info, pending.take_fd(), pending.epoch)

    return Call(
        lambda rid: ModelLoadRequest(
            id=rid, fd=fd, name=name, shapes=shapes, constants=constants or {}, sizes=sizes or {}
        ),
        finish,
    )


def ignored_sizes_error() -> Unsupported:
    """The error for a load whose several sizes npud ignored (it predates them)."""
    what = (
        "several sizes of a dimension: npud loaded the model as one graph (it predates"
        " them; load one model per size, or update npud)"
    )
    return Unsupported(code_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})


def ignored_constants_error(names: list[str]) -> Unsupported:
    """The error for a load whose constants npud ignored (it predates them)."""
    what = (
        f"constants: npud loaded the model with {', '.join(repr(n) for n in names)} still an"
        " input (it predates fixing inputs to values at load; give them as inputs and the"
        " outputs' shapes, or update npud)"
    )
    return Unsupported(code_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})


def model_info(model: ModelState) -> Call[ModelInfo]:
    model.check_loaded()
    return Call(lambda rid: ModelInfoRequest(id=rid, model=model.id), _model_info)


def _model_info(pending: Pending) -> ModelInfo:
    return pending.result(ModelInfoReply).info


def graph_of(core: ClientCore[Any], model: ModelState, graph: str | None) -> int:
    """The index of the graph named ``graph`` (None or "": the first). Unsupported
    against a daemon below protocol version 5, which would run the first graph whatever
    the request named; InvalidTensorIndex for a name the model does not have."""
    if graph and not speaks(core.protocol_version, Feature.GRAPHS):
        what = (
            f"graph= (npud speaks protocol version {core.protocol_version}; naming a graph"
            f" needs {SINCE[Feature.GRAPHS]}): it runs the first graph only"
        )
        raise Unsupported(code_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})
    return model.graph_index(graph)


def run_model(
    core: ClientCore[Any],
    model: ModelState,
    timeout: float | None,
    deadline: float | None,
    graph: int = 0,
) -> Call[None]:
    """One run of graph ``graph`` (an index from :func:`graph_of`) on the inputs in the
    arena; afterwards its outputs are there."""
    timeout_ms, deadline_ms = call_timing(timeout, deadline, core.limits, core.protocol_version)
    model.before_run(graph)
    name = model.graphs[graph].name if graph else ""

    def finish(pending: Pending) -> None:
        reply = pending.result(ModelRunReply)
        model.after_run(reply.dsp_us, graph, reply.output_shapes)

    return Call(
        lambda rid: ModelRunRequest(
            id=rid, model=model.id, timeout_ms=timeout_ms, deadline_ms=deadline_ms, graph=name
        ),
        finish,
    )


def unload_model(core: ClientCore[Any], model: ModelState) -> Call[None]:
    """Unload ``model`` in the daemon, then here. Gone already (the connection, a DSP
    restart, an earlier unload): not an error."""

    def finish(pending: Pending) -> None:
        if pending.error is not None and not isinstance(
            pending.error, ConnectionClosedError | DspRestarted | ModelNotLoaded
        ):
            raise pending.error
        core.forget_model(model)
        model.release_local("unloaded")

    return Call(lambda rid: ModelUnloadRequest(id=rid, model=model.id), finish)


def discard_model(model_id: int) -> Call[None]:
    """Unload a model this side could not map (there is nothing to release here)."""
    return Call(lambda rid: ModelUnloadRequest(id=rid, model=model_id), _unloaded)


def _unloaded(pending: Pending) -> None:
    pending.result(ModelUnloadReply)


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


DEBUG_ACTIONS: Final = ("ssr", "latency", "fail_next_invoke", "clear")


def debug_fault(action: str, duration: float, code: int, domain: str = "") -> Call[str]:
    """Inject a fault into the emulated DSP (root only, the emulator only); ``domain``
    names the domain whose DSP process ``ssr`` crashes (version 3)."""
    if action not in DEBUG_ACTIONS:
        raise ValueError(f"action must be one of {', '.join(DEBUG_ACTIONS)}, not {action!r}")
    if not isinstance(duration, int | float) or isinstance(duration, bool) or duration < 0:
        raise ValueError(f"duration must be a number of seconds >= 0, got {duration!r}")
    milliseconds = round(duration * 1000)
    if milliseconds > 0xFFFF_FFFF or not 0 <= code <= 0xFFFF_FFFF:
        raise ValueError("duration or code out of range")
    request = DebugRequest(
        id=0,
        action=action,  # type: ignore[arg-type]
        duration_ms=milliseconds,
        code=code,
        domain=domain,
    )
    return Call(lambda rid: msgspec.structs.replace(request, id=rid), _debug_detail)


def _debug_detail(pending: Pending) -> str:
    return pending.result(DebugReply).detail

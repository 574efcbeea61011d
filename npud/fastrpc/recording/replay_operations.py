"""The session operations a trace records, run again on a FastRpcSession: one function
per operation (``open``, ``alloc``, ``invoke``, the system heap's ...), each given the
recorded arguments and returning what the replayer compares with the recorded result.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.dma_heap import DmaHeap
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, OutArg, Slice
from npud.fastrpc.kernel.trace_hooks import JsonValue, Record
from npud.fastrpc.recording.replay_driver import ReplayDriver
from npud.fastrpc.recording.trace_file import TraceFormatError
from npud.fastrpc.recording.trace_format import decode_data
from npud.fastrpc.reverse.exposed_files import EXPOSED_PREFIX, ExposedFile
from npud.fastrpc.session import FastRpcSession


class ReplayState:
    """What the replayed operations made, by their names in the trace: sessions, heaps,
    buffers and exposed files, and the driver and library they run with."""

    def __init__(self, driver: ReplayDriver, library: Path) -> None:
        self.driver = driver
        self.library = library
        self.sessions: dict[int, FastRpcSession] = {}
        self.heaps: dict[int, DmaHeap | None] = {}
        self.buffers: dict[tuple[int, JsonValue], object] = {}
        self.exposed: dict[str, ExposedFile] = {}

    def run_operation(self, op: Record) -> Record:
        """Run one recorded operation; what it returned, for the replayer to compare."""
        name = str(op["op"])
        args: Record = op.get("args") or {}
        session_id = int(op.get("session", 0))
        if name == "open":
            return _op_open(self, session_id, args)
        if name in _HEAP_OPERATIONS:
            return _HEAP_OPERATIONS[name](self, session_id, args, op)
        handler = _OPERATIONS.get(name)
        if handler is None:
            raise TraceFormatError(f"op {op.get('id')}: unknown operation {name!r}")
        session = self.sessions.get(session_id)
        if session is None:
            raise TraceFormatError(f"op {op.get('id')}: session {session_id} was never opened")
        return handler(self, session, session_id, args, op)

    def buffer(self, session: int, buffer_ref: JsonValue) -> object:
        """A buffer by its trace name: ``h<n>`` is the system heap's (any session may pass
        it), a number is the session's own."""
        if isinstance(buffer_ref, str):
            return self.buffers[(HEAP_BUFFERS, buffer_ref)]
        return self.buffers[(session, int(buffer_ref))]

    def close_leftovers(self) -> None:
        for heap in self.heaps.values():
            if heap is not None:
                with contextlib.suppress(Exception):
                    heap.close()
        for exposed in list(self.exposed.values()):
            with contextlib.suppress(Exception):
                exposed.close()
        for session in self.sessions.values():
            with contextlib.suppress(Exception):
                session.close(timeout=1.0)


def _op_open(r: ReplayState, sid: int, args: Record) -> Record:
    nodes = [str(n) for n in args.get("nodes", abi.CDSP_NODES)]
    session = FastRpcSession.open(r.driver, nodes=nodes, library_path=[r.library])
    r.sessions[sid] = session
    return {"device": session.device}


def _op_load_shell(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    # The shell's bytes travel in a DMA-BUF: the trace compares their length, not them.
    s.load_shell(bytes(int(args["size"])) or b"\0", attrs=int(args.get("attrs", 8)))
    return {}


def _op_alloc(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    buffer = s.alloc(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.id)
    r.buffers[(sid, int(recorded))] = buffer
    return {"buffer": buffer.id, "size": buffer.size}


def _op_alloc_unowned(
    r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    buffer = s.alloc_unowned(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.id)
    r.buffers[(sid, int(recorded))] = buffer
    return {"buffer": recorded, "size": buffer.size}


def _op_free(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    s.free(r.buffer(sid, args["buffer"]))  # type: ignore[arg-type]
    return {}


def _op_map(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    buffer = r.buffer(sid, args["buffer"])
    flags = int(args.get("flags", abi.FASTRPC_MAP_FD))
    return {"address": s.map(buffer, flags)}  # type: ignore[arg-type]


def _op_unmap(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    s.unmap(r.buffer(sid, args["buffer"]))  # type: ignore[arg-type]
    return {}


def _op_invoke(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    inputs: list[InArg] = []
    for item in args.get("inputs", []):
        if "slice" in item:
            buffer_id, offset, length = item["slice"]
            buffer = r.buffer(sid, buffer_id)
            data = decode_data(item["data"]) if item.get("data") else None
            if data is not None:
                view = buffer.view()  # type: ignore[attr-defined]
                view[offset : offset + length] = r.driver.to_actual(data)
                del view
            inputs.append(Slice(buffer, offset, length))  # type: ignore[arg-type]
        else:
            inputs.append(Inline(r.driver.to_actual(decode_data(item["inline"]) or b"")))
    outputs: list[OutArg] = []
    for item in args.get("outputs", []):
        if "slice" in item:
            buffer_id, offset, length = item["slice"]
            outputs.append(Slice(r.buffer(sid, buffer_id), offset, length))  # type: ignore[arg-type]
        else:
            outputs.append(Capacity(int(item["capacity"])))
    result = s.invoke(int(args["handle"]), int(args["sc"]), inputs, outputs)
    encoded = [
        None if data is None else {"len": len(data), "b64": _b64(data)} for data in result.outputs
    ]
    return {"rc": result.rc, "outputs": encoded}


def _b64(data: bytes) -> str:
    import base64  # noqa: PLC0415 - only results of replayed invokes need it

    return base64.b64encode(data.rstrip(b"\0")).decode("ascii")


def _op_remote_open(
    r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    return {"handle": s.remote_open(str(args["uri"]))}


def _op_remote_close(
    r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    s.remote_close(int(args["handle"]))
    return {}


def _op_probe_handle(
    r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    return {"rc": s.probe_static_handle(int(args["handle"]))}


def _op_expose_file(
    r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    record = args.get("data") or {"len": 0, "b64": ""}
    data = decode_data(record)
    if data is None:
        data = bytes(int(record.get("len", 0)))  # only a digest: the DSP reads zeros
    fd = os.memfd_create("replay-exposed", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        exposed = s.expose_file(fd, suffix=str(args.get("suffix", "")))
    finally:
        os.close(fd)
    recorded = str((op.get("result") or {}).get("name", exposed.name))
    if recorded.startswith(EXPOSED_PREFIX):
        r.driver.alias(recorded, exposed.name)
    r.exposed[recorded] = exposed
    return {"name": recorded}


def _op_unexpose(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    exposed = r.exposed.pop(str(args["name"]), None)
    if exposed is not None:
        exposed.close()
    return {}


def _op_close(r: ReplayState, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    timeout = args.get("timeout")
    s.close(timeout=None if timeout is None else float(timeout))
    return {}


HEAP_BUFFERS: Final = -1
"""Where the replayer keeps the system heap's buffers (their trace names are ``h<n>``)."""


def _op_heap_open(r: ReplayState, sid: int, args: Record, op: Record) -> Record:
    heap = DmaHeap.open(r.driver, str(args.get("path", abi.DMA_HEAP_SYSTEM)))
    r.heaps[sid] = heap
    return {"available": heap is not None}


def _op_heap_alloc(r: ReplayState, sid: int, args: Record, op: Record) -> Record:
    heap = r.heaps.get(sid)
    if heap is None:
        raise TraceFormatError(f"op {op.get('id')}: heap {sid} was never opened")
    buffer = heap.allocate(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.trace_ref)
    r.buffers[(HEAP_BUFFERS, str(recorded))] = buffer
    return {"buffer": recorded, "size": buffer.size}


def _op_heap_close(r: ReplayState, sid: int, args: Record, op: Record) -> Record:
    heap = r.heaps.pop(sid, None)
    if heap is not None:
        heap.close()
    return {}


def _op_release(r: ReplayState, sid: int, args: Record, op: Record) -> Record:
    buffer = r.buffer(sid, args["buffer"])
    assert isinstance(buffer, DmaBuffer)
    buffer.give_up()
    return {}


_Operation = Callable[[ReplayState, FastRpcSession, int, Record, Record], Record]
_HeapOperation = Callable[[ReplayState, int, Record, Record], Record]
_HEAP_OPERATIONS: Final[dict[str, _HeapOperation]] = {
    "heap_open": _op_heap_open,
    "heap_alloc": _op_heap_alloc,
    "heap_close": _op_heap_close,
    "release": _op_release,
}
"""Operations of the system heap and of buffers let go by their owner: no session."""
_OPERATIONS: Final[dict[str, _Operation]] = {
    "load_shell": _op_load_shell,
    "alloc": _op_alloc,
    "alloc_unowned": _op_alloc_unowned,
    "free": _op_free,
    "map": _op_map,
    "unmap": _op_unmap,
    "invoke": _op_invoke,
    "remote_open": _op_remote_open,
    "remote_close": _op_remote_close,
    "probe_handle": _op_probe_handle,
    "expose_file": _op_expose_file,
    "unexpose": _op_unexpose,
    "close": _op_close,
}

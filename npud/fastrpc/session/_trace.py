"""Tracing: what a session records of itself besides its driver calls (its operations,
the listener's thread, the reverse calls and the files they serve); the driver calls
themselves are recorded by the tracing Driver that wraps the real one."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from npud.fastrpc.kernel.invoke_args import InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.kernel.trace_hooks import Record, TraceHooks, encode_data
from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.exposed_files import ExposedFile
from npud.fastrpc.reverse.reverse_modules import CallDescription, ReverseObserver

T = TypeVar("T")
Invoke = Callable[[int, int, Sequence[InArg], Sequence[OutArg]], InvokeResult]


class SessionTrace:
    """What a session records of itself beyond its driver calls, when its driver traces
    (``hooks``), and nothing otherwise.

    The driver calls are recorded by the tracing Driver that wraps the real one
    (``npud.fastrpc.recording.trace.TracingDriver``). Three things no driver call shows
    are recorded here, through the narrow :class:`TraceHooks`: the session's public
    operations (an ``op`` record groups the calls each made, and holds its arguments and
    result as the caller gave them: a replay runs them again), which thread is the
    listener's (its calls are the ``listener`` side), and the reverse calls and files the
    listener served (work on the host, not on the driver). Only the facade and the
    process part use it."""

    def __init__(self, hooks: TraceHooks | None, session: int = 0) -> None:
        self.hooks = hooks
        self.session = session

    def op(
        self,
        name: str,
        args: Callable[[], Record],
        run: Callable[[], T],
        result: Callable[[T], Record] | None = None,
    ) -> T:
        """Run ``run`` as operation ``name`` when the driver traces; plainly otherwise."""
        hooks = self.hooks
        if hooks is None:
            return run()
        with hooks.operation(name, self.session, **args()) as op:
            value = run()
            if result is not None:
                op.result(**result(value))
            return value

    def invoke(
        self,
        handle: int,
        sc: int,
        inputs: Sequence[InArg],
        outputs: Sequence[OutArg],
        run: Callable[[], InvokeResult],
    ) -> InvokeResult:
        """An invoke as an operation: its arguments' bytes in, its outputs' bytes out."""
        hooks = self.hooks
        if hooks is None:
            return run()
        limit = hooks.capture_limit
        args = {
            "handle": handle,
            "sc": sc,
            "inputs": [traced_arg(arg, limit, data=True) for arg in inputs],
            "outputs": [traced_arg(arg, limit, data=False) for arg in outputs],
        }
        with hooks.operation("invoke", self.session, **args) as op:
            result = run()
            outs = [None if out is None else encode_data(out, limit) for out in result.outputs]
            op.result(rc=result.rc, outputs=outs)
            return result

    def expose(self, fd: int, suffix: str, run: Callable[[], ExposedFile]) -> ExposedFile:
        """A file lent to the DSP as an operation (its bytes in the record), and its
        return (``unexpose``) when the ExposedFile closes."""
        hooks, session = self.hooks, self.session
        if hooks is None:
            return run()
        args: Record = {"suffix": suffix, "data": None}
        with contextlib.suppress(OSError):  # expose() says what is wrong with the descriptor
            args["data"] = file_record(fd, hooks.capture_limit)
        with hooks.operation("expose_file", session, **args) as op:
            exposed = run()
            op.result(name=exposed.name)

        def closed() -> None:
            with hooks.operation("unexpose", session, name=exposed.name):
                pass

        exposed.on_close = closed
        return exposed

    def listener_invoke(self, invoke: Invoke) -> Invoke:
        """``invoke`` as the listener's thread calls it: marked as the listener's."""
        hooks, session = self.hooks, self.session
        if hooks is None:
            return invoke

        def listener_invoke(
            handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
        ) -> InvokeResult:
            hooks.listener_thread(session)
            return invoke(handle, sc, inputs, outputs)

        return listener_invoke

    def observer(self, apps_std: AppsStdServer) -> ReverseObserver | None:
        """What records the reverse calls and the files apps_std served, or None."""
        hooks, session = self.hooks, self.session
        if hooks is None:
            return None

        def observe(
            handle: int, module: str, method: int, description: CallDescription, result: int
        ) -> None:
            call: Record = {
                "handle": handle,
                "module": module,
                "method": method,
                "name": description.method,
                "file": description.file,
                "result": result,
            }
            hooks.reverse_call(session, call)
            if result == 0 and description.file and module == "apps_std":
                target = apps_std.resolve(description.file)
                if isinstance(target, Path):
                    try:
                        with open(target, "rb") as file:
                            data = file.read(hooks.capture_limit + 1)
                    except OSError:
                        return
                    hooks.file_served(session, target.name, data)

        return observe


def traced_arg(arg: InArg | OutArg, limit: int, *, data: bool) -> Record:
    """An invoke argument as a trace records it (a slice's bytes too, for inputs)."""
    if isinstance(arg, Slice):
        record: Record = {"slice": [arg.buffer.trace_ref, arg.offset, arg.length]}
        if data:
            view = arg.buffer.view()
            record["data"] = encode_data(bytes(view[arg.offset : arg.offset + arg.length]), limit)
            del view
        return record
    if isinstance(arg, Inline):
        return {"inline": encode_data(arg.data, limit)}
    return {"capacity": arg.size}


def file_record(fd: int, limit: int) -> Record:
    """The file behind ``fd`` as a trace data record, read with pread (the offset stays
    the caller's); past ``limit`` only its length and SHA-256, hashed as it streams."""
    size = os.fstat(fd).st_size
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        digest.update(chunk)
        if size <= limit:
            chunks.append(chunk)
        offset += len(chunk)
    if size <= limit:
        return encode_data(b"".join(chunks), limit)
    return {"len": offset, "sha256": digest.hexdigest()}

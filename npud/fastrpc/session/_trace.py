"""Tracing: what a tracing driver records of the listener's calls, the reverse calls and
the files they serve, and of invoke arguments and exposed files."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from npud.fastrpc.kernel.invoke_args import InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.kernel.trace_hooks import Record, encode_data
from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.reverse_modules import CallDescription, ReverseObserver
from npud.fastrpc.session._invoke import Invoking


class Tracing(Invoking):
    """The trace hooks of the listener and the reverse modules (``_traced`` wraps the
    public calls, in :mod:`npud.fastrpc.session._state`)."""

    def _listener_invoke(
        self,
    ) -> Callable[[int, int, Sequence[InArg], Sequence[OutArg]], InvokeResult]:
        hooks, session = self._hooks, self._trace_session
        if hooks is None:
            return self._invoke_untracked

        def invoke(
            handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
        ) -> InvokeResult:
            hooks.listener_thread(session)
            return self._invoke_untracked(handle, sc, inputs, outputs)

        return invoke

    def _trace_observer(self, apps_std: AppsStdServer) -> ReverseObserver | None:
        hooks, session = self._hooks, self._trace_session
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

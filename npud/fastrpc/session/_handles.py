"""Remote handles: remotectl open and close of skels (remotectl1 first, remotectl after),
and the invokes on the handles they give, counted so a close waits for the last one."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Final

from npu_protocol import ErrorCode, describe_result
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg
from npud.fastrpc.session import _remotectl as remotectl
from npud.fastrpc.session._invoke import Invoker
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log
from npud.fastrpc.session._process import Process

PROBED_STATIC_HANDLES: Final = frozenset({9, 10})
"""Static handles (libcdsprpc treats 0..10 as static) that no interface is known for."""


class Handles:
    """The skels opened in the DSP process (remotectl open / close) and the calls on
    them: each handle's calls are counted, so a close waits for the last one."""

    def __init__(self, invoker: Invoker, life: Life, process: Process) -> None:
        self._invoker = invoker
        self._life = life
        self._process = process
        self._lock = threading.Lock()
        self._handles: set[int] = set()
        self._calls: dict[int, int] = {}  # invokes on the DSP, per handle
        self._closing: set[int] = set()  # closed by the client, awaiting their end
        self._remotectl: remotectl.RemotectlGeneration | None = None

    @property
    def remotectl_name(self) -> str:
        """The remotectl interface the DSP answered on, once known."""
        return self._remotectl.name if self._remotectl else ""

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)

    def open(self, uri: str) -> int:
        """remotectl open of the skel ``uri`` (see FastRpcSession.remote_open)."""
        self._life.require_process()
        request = remotectl.pack_open(uri)

        def call(generation: remotectl.RemotectlGeneration) -> InvokeResult:
            return self._invoker.counted(
                generation.handle,
                generation.open_sc,
                (Inline(request.prim_in), Inline(request.name)),
                (Capacity(generation.open.prim_rout.size), Capacity(remotectl.DLERROR_CAPACITY)),
            )

        generation = self._remotectl
        if generation is None:
            result = call(remotectl.REMOTECTL1)
            if result.rc != 0:
                log.info(
                    "no remotectl1 on the DSP; using remotectl",
                    extra={"result": describe_result(result.rc)},
                )
                self._remotectl = remotectl.REMOTECTL
                result = call(remotectl.REMOTECTL)
            elif result.rc == 0:
                self._remotectl = remotectl.REMOTECTL1
        else:
            result = call(generation)
        if result.rc != 0:
            raise RpcError(
                ErrorCode.OPEN_FAILED, uri=uri, code=result.rc, detail="remotectl call failed"
            )
        reply = remotectl.unpack_open(result.output(0), result.output(1))
        if reply.error != 0:
            raise RpcError(
                ErrorCode.OPEN_FAILED,
                uri=uri,
                code=reply.error,
                detail=reply.dlerror or "no detail",
            )
        with self._lock:
            self._handles.add(reply.handle)
        return reply.handle

    def probe_static(self, handle: int) -> int:
        """Method 0 without arguments on static ``handle`` (checked by the caller)."""
        self._life.require_process()
        return self._invoker.counted(handle, abi.remote_scalars_make(0, 0, 0), (), ()).rc

    def invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """Method ``sc`` on an open handle; counted, so its close waits for the call."""
        with self._lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._calls[handle] = self._calls.get(handle, 0) + 1
        try:
            result = self._invoker.counted(handle, sc, inputs, outputs)
            if result.rc and self._process.crashed_under(result.rc):
                raise RpcError(ErrorCode.DSP_RESTARTED)
            return result
        finally:
            with self._lock:
                self._calls[handle] -= 1
                close_now = not self._calls[handle] and handle in self._closing
                if not self._calls[handle]:
                    del self._calls[handle]
                if close_now:
                    self._closing.discard(handle)
            if close_now:
                self._remotectl_close_quietly(handle)

    def close(self, handle: int) -> None:
        """remotectl close of ``handle``, deferred while calls on it run."""
        with self._lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handles.discard(handle)
            if self._calls.get(handle):
                self._closing.add(handle)
                return
        self._remotectl_close(handle)

    def forget_all(self) -> None:
        """At close: the handles go with the DSP process."""
        with self._lock:
            self._handles.clear()

    def _remotectl_close_quietly(self, handle: int) -> None:
        try:
            self._remotectl_close(handle)
        except RpcError as exc:
            log.warning(
                "deferred remotectl close failed",
                extra={"handle": f"0x{handle:x}", "error": str(exc)},
            )

    def _remotectl_close(self, handle: int) -> None:
        generation = self._remotectl or remotectl.REMOTECTL
        result = self._invoker.counted(
            generation.handle,
            generation.close_sc,
            (Inline(remotectl.pack_close(handle)),),
            (Capacity(generation.close.prim_rout.size), Capacity(remotectl.DLERROR_CAPACITY)),
        )
        if result.rc != 0:
            raise RpcError(ErrorCode.FASTRPC, rc=result.rc)
        error, dlerror = remotectl.unpack_close(result.output(0), result.output(1))
        if error != 0:
            log.warning(
                "remotectl close refused",
                extra={"handle": f"0x{handle:x}", "result": f"0x{error:x}", "dlerror": dlerror},
            )

"""Remote handles: remotectl open and close of skels (remotectl1 first, remotectl after),
and the invokes on the handles they give, counted so a close waits for the last one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from npu_protocol import ErrorCode, describe_result
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg
from npud.fastrpc.kernel.trace_hooks import encode_data
from npud.fastrpc.session import _remotectl as remotectl
from npud.fastrpc.session._process import Process
from npud.fastrpc.session._state import log
from npud.fastrpc.session._trace import traced_arg

PROBED_STATIC_HANDLES: Final = frozenset({9, 10})
"""Static handles (libcdsprpc treats 0..10 as static) that no interface is known for."""


class RemoteHandles(Process):
    """The skels opened in the DSP process and the calls on them."""

    def remote_open(self, uri: str) -> int:
        """remotectl open: load the skel named by ``uri``; returns its handle.

        The first open tries ``remotectl1`` (handle 8) and falls back to
        ``remotectl`` (handle 0) for good when the DSP answers anything but 0, as
        libcdsprpc's ``remote_handle_open_domain`` does: a firmware without handle 8
        may answer any code (AEE_ERPC and AEE_ENOSUCHMOD are only the usual ones).
        """
        return self._traced(
            "remote_open",
            lambda: {"uri": uri},
            lambda: self._remote_open(uri),
            lambda handle: {"handle": handle},
        )

    def _remote_open(self, uri: str) -> int:
        self._require_process()
        request = remotectl.pack_open(uri)

        def call(generation: remotectl.RemotectlGeneration) -> InvokeResult:
            return self._invoke_raw(
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
        with self._state_lock:
            self._handles.add(reply.handle)
        return reply.handle

    def probe_static_handle(self, handle: int) -> int:
        """Invoke method 0, without arguments, on static handle 9 or 10, which no interface
        is known for, and return the DSP's answer: what this firmware answers for a static
        module it lacks (the bring-up's fidelity scenario; libcdsprpc falls back from
        handles 7 and 8 on such answers). Never used by the daemon."""
        if handle not in PROBED_STATIC_HANDLES:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"handle {handle}: only {sorted(PROBED_STATIC_HANDLES)} may be probed",
            )
        return self._traced(
            "probe_handle",
            lambda: {"handle": handle},
            lambda: self._probe_static_handle(handle),
            lambda rc: {"rc": rc},
        )

    def _probe_static_handle(self, handle: int) -> int:
        self._require_process()
        return self._invoke_raw(handle, abi.remote_scalars_make(0, 0, 0), (), ()).rc

    def invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """Invoke method ``sc`` on a handle opened by :meth:`remote_open`.

        Returns the DSP's result code (0 = success) and the output bytes;
        transport failures raise RpcError.
        """
        hooks = self._hooks
        if hooks is None:
            return self._invoke(handle, sc, inputs, outputs)
        limit = hooks.capture_limit
        args = {
            "handle": handle,
            "sc": sc,
            "inputs": [traced_arg(arg, limit, data=True) for arg in inputs],
            "outputs": [traced_arg(arg, limit, data=False) for arg in outputs],
        }
        with hooks.operation("invoke", self._trace_session, **args) as op:
            result = self._invoke(handle, sc, inputs, outputs)
            outs = [None if out is None else encode_data(out, limit) for out in result.outputs]
            op.result(rc=result.rc, outputs=outs)
            return result

    def _invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        with self._state_lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handle_calls[handle] = self._handle_calls.get(handle, 0) + 1
        try:
            result = self._invoke_raw(handle, sc, inputs, outputs)
            if result.rc and self._crashed_under(result.rc):
                raise RpcError(ErrorCode.DSP_RESTARTED)
            return result
        finally:
            with self._state_lock:
                self._handle_calls[handle] -= 1
                close_now = not self._handle_calls[handle] and handle in self._closing_handles
                if not self._handle_calls[handle]:
                    del self._handle_calls[handle]
                if close_now:
                    self._closing_handles.discard(handle)
            if close_now:
                self._remotectl_close_quietly(handle)

    def remote_close(self, handle: int) -> None:
        """remotectl close (handle 0) of a handle from :meth:`remote_open`.

        While invokes on the handle are still on the DSP the close is deferred:
        the last of them closes it (unloading a skel under a running call would
        take the whole DSP process down).
        """
        self._traced("remote_close", lambda: {"handle": handle}, lambda: self._remote_close(handle))

    def _remote_close(self, handle: int) -> None:
        with self._state_lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handles.discard(handle)
            if self._handle_calls.get(handle):
                self._closing_handles.add(handle)
                return
        self._remotectl_close(handle)

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
        result = self._invoke_raw(
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

"""The reverse-RPC listener: a thread blocked in INVOKE on handle 3 (reference 5.6).

The DSP cannot read files itself. When it needs one (a skel library during
remotectl open), it queues a request that completes this thread's pending
``next2`` call; we serve it with :class:`AppsStdServer` and hand the reply
back in the following ``next2``.

The thread is owned by the FastRpcSession that started it. It ends when the
DSP process exits (``next2`` answers AEE_EBADSTATE), when the DSP restarts
(EPIPE), or on any unexpected failure, which it logs; it never hangs waiting
on anything but the DSP.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from npu_protocol import AEE, ErrorCode
from npud.fastrpc import abi
from npud.fastrpc.apps_std import AppsStdServer, Reply
from npud.fastrpc.errors import RpcError
from npud.fastrpc.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg
from npud.fastrpc.marshal import PackedReader, pack_buffers

log = logging.getLogger(__name__)

INIT2_SC: Final = abi.remote_scalars_make(3, 0, 0)  # 0x03000000
NEXT2_SC: Final = abi.remote_scalars_make(4, 2, 2)  # 0x04020200
GET_IN_BUFS2_SC: Final = abi.remote_scalars_make(5, 1, 2)  # 0x05010200
REQUEST_CAPACITY: Final = 64 * 1024
PROCESS_EXITED: Final = "the DSP process exited"
"""The listener's stop reason when the session ended the DSP process (the normal end)."""
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024  # a peer's length is bounded before we fetch

RawInvoke = Callable[[int, int, Sequence[InArg], Sequence[OutArg]], InvokeResult]


@dataclass
class ListenerStatistics:
    requests: int = 0
    failures: int = 0
    stopped_because: str = ""


class ReverseRpcListener:
    def __init__(self, invoke: RawInvoke, server: AppsStdServer) -> None:
        self._invoke = invoke
        self._server = server
        self._thread: threading.Thread | None = None
        self.stats = ListenerStatistics()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("listener already started")
        result = self._invoke(abi.ADSP_LISTENER_HANDLE, INIT2_SC, (), ())
        if result.rc != 0:
            raise RpcError(ErrorCode.FASTRPC, rc=result.rc)
        self._thread = threading.Thread(target=self._run, name="fastrpc-listener", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (after the DSP process was told to exit); True if it ended."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the loop ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.stats.stopped_because = self._serve()
        except RpcError as exc:
            self.stats.stopped_because = str(exc)
        except Exception:  # the thread must log, not vanish silently
            log.exception("reverse-RPC listener failed")
            self.stats.stopped_because = "internal error (see log)"
        finally:
            self._server.close()
            reason = self.stats.stopped_because
            log.log(
                logging.INFO if reason == PROCESS_EXITED else logging.WARNING,
                "reverse-RPC listener stopped",
                extra={"reason": reason},
            )

    def _serve(self) -> str:
        ctx, result, reply = 0, -1, b""
        while True:
            prim = struct.pack("<IiII", ctx, result, len(reply), REQUEST_CAPACITY)
            res = self._invoke(
                abi.ADSP_LISTENER_HANDLE,
                NEXT2_SC,
                (Inline(prim), Inline(reply)),
                (Capacity(16), Capacity(REQUEST_CAPACITY)),
            )
            if res.rc == AEE.EINTERRUPTED:
                ctx, result, reply = 0, -1, b""
                continue
            if res.rc == AEE.EBADSTATE.dsp:
                return PROCESS_EXITED
            if res.rc != 0:
                return f"next2 answered 0x{res.rc:08X}"
            ctx, handle, sc, needed = struct.unpack("<IIII", res.output(0))
            answer = self._handle(ctx, handle, sc, needed, res.output(1))
            self.stats.requests += 1
            if answer.result != 0:
                self.stats.failures += 1
            result = answer.result
            reply = pack_buffers(answer.outputs) if answer.result == 0 else b""

    def _handle(self, ctx: int, handle: int, sc: int, needed: int, first: bytes) -> Reply:
        if needed > MAX_REQUEST_BYTES:
            return Reply(int(AEE.EBADPARM))
        blob = first[: min(needed, REQUEST_CAPACITY)]
        while len(blob) < needed:
            chunk = self._fetch(ctx, len(blob), needed - len(blob))
            if not chunk:
                return Reply(int(AEE.EBADPARM))
            blob += chunk
        reader = PackedReader(blob)
        try:
            inputs = reader.buffers(abi.remote_scalars_inbufs(sc))
            caps = reader.lengths(abi.remote_scalars_outbufs(sc))
        except ValueError:
            return Reply(int(AEE.EBADPARM))
        try:
            return self._server.dispatch(handle, sc, inputs, caps)
        except Exception:
            # No single request may end the listener: without it no skel loads.
            log.exception("reverse call failed", extra={"sc": f"0x{sc:08X}", "handle": handle})
            return Reply(int(AEE.EFAILED))

    def _fetch(self, ctx: int, offset: int, remaining: int) -> bytes:
        capacity = min(remaining, REQUEST_CAPACITY)
        res = self._invoke(
            abi.ADSP_LISTENER_HANDLE,
            GET_IN_BUFS2_SC,
            (Inline(struct.pack("<III", ctx, offset, capacity)),),
            (Capacity(4), Capacity(capacity)),
        )
        if res.rc != 0:
            return b""
        (available,) = struct.unpack("<I", res.output(0))
        return res.output(1)[: min(available, capacity)]

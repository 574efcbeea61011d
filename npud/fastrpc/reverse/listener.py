"""The reverse-RPC listener: a thread blocked in INVOKE on the listener handle (reference 5.6).

The DSP cannot read files or grow its heap itself. When it needs either (a
skel library during remotectl open, a model file, more heap), it queues a
request that completes this thread's pending ``next2`` call; we serve it with
:class:`~npud.fastrpc.reverse.reverse_modules.ReverseModules` and hand the reply back
in the following ``next2``.

Start-up follows libcdsprpc's ``listener_start_thread``: ``init2`` runs on
the listener thread itself, first on the domain-style ``adsp_listener1``
(static handle 7, methods 5/6/7) and, when the DSP answers AEE_ERPC or
AEE_ENOSUCHMOD (older firmware), on ``adsp_listener`` (handle 3, methods
3/4/5); the thread keeps the generation that answered. Any other failure of
handle 7's init2 leaves the thread serving through handle 3 without an init2
there, as libcdsprpc's ``listener_start_thread`` does (it logs and goes on to
its loop). :meth:`start` waits for that outcome; a failed init2 on handle 3
itself fails the shell load.

The loop follows libcdsprpc's ``listener``: next2 answering
AEE_EINTERRUPTED is issued again with ctx 0, AEE_EBADSTATE (the process
exited) ends it, and any other failure is answered by one more next2 that
carries that failure as prevResult (and no reply); a second failure ends it.

The thread blocks every signal: a signal delivered to it would interrupt its
INVOKE (EINTR). If one still does (the suspend freezer, a kernel that
restarts the wait), the interrupted ``next2`` is issued again with no reply,
like AEE_EINTERRUPTED: its reply had already been sent; a request the DSP
handed to the abandoned call is lost and that reverse call times out on the
DSP (logged there, not here).

The thread is owned by the FastRpcSession that started it. It ends when the
DSP process exits (``next2`` answers AEE_EBADSTATE), when the DSP restarts
(EPIPE), or on any unexpected failure, which it logs; it never hangs waiting
on anything but the DSP.

The methods and their layouts come from ``idl/adsp_listener.idl`` and
``idl/adsp_listener1.idl`` through :mod:`npud.idl`, the description the
emulator's DSP side serves; only the packed request and reply blobs inside
the buffers (:mod:`npud.fastrpc.kernel.marshal`) are listener-specific.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from npu_protocol import AEE, ErrorCode, describe_result
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import InterruptedCallError, RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg
from npud.fastrpc.kernel.marshal import PackedReader, pack_buffers
from npud.fastrpc.reverse.reverse_modules import Reply, ReverseModules

log = logging.getLogger(__name__)

REQUEST_CAPACITY: Final = 64 * 1024
PROCESS_EXITED: Final = "the DSP process exited"
"""The listener's stop reason when the session ended the DSP process (the normal end)."""
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024  # a peer's length is bounded before we fetch
START_TIMEOUT: Final = 10.0  # the kernel's own timeout for its internal calls
THREAD_NAME: Final = "fastrpc-listener"
FALLBACK_RESULTS: Final = frozenset({AEE.ERPC.dsp, AEE.ENOSUCHMOD.dsp})
"""What a DSP without the domain-style listener answers on handle 7 (libcdsprpc falls back)."""

RawInvoke = Callable[[int, int, Sequence[InArg], Sequence[OutArg]], InvokeResult]


@dataclass(frozen=True)
class ListenerGeneration:
    """A listener interface: its static handle and its three methods (from its IDL)."""

    name: str
    handle: int
    interface: idl.Interface

    @property
    def init2(self) -> idl.Method:
        return self.interface.method("init2")

    @property
    def next2(self) -> idl.Method:
        return self.interface.method("next2")

    @property
    def get_in_bufs2(self) -> idl.Method:
        return self.interface.method("get_in_bufs2")

    @property
    def init2_sc(self) -> int:
        return self.init2.sc

    @property
    def next2_sc(self) -> int:
        return self.next2.sc

    @property
    def get_in_bufs2_sc(self) -> int:
        return self.get_in_bufs2.sc


LISTENER1: Final = ListenerGeneration(
    "adsp_listener1", abi.ADSP_LISTENER1_HANDLE, idl.load("adsp_listener1")
)
LISTENER: Final = ListenerGeneration(
    "adsp_listener", abi.ADSP_LISTENER_HANDLE, idl.load("adsp_listener")
)
GENERATIONS: Final = (LISTENER1, LISTENER)
"""Tried in this order, as libcdsprpc does."""


@dataclass
class ListenerStatistics:
    requests: int = 0
    failures: int = 0
    interrupted: int = 0
    retries: int = 0
    """next2 calls sent again after a failure, with it as prevResult (libcdsprpc's retry)."""
    generation: str = ""
    stopped_because: str = ""


class ReverseRpcListener:
    def __init__(
        self,
        invoke: RawInvoke,
        modules: ReverseModules,
        on_stopped: Callable[[str], None] | None = None,
    ) -> None:
        """``on_stopped`` hears, on the listener's thread, why it stopped serving (once,
        after a successful start): its owner tells an exit it asked for from a DSP
        process that ended on its own."""
        self._invoke = invoke
        self._modules = modules
        self._on_stopped = on_stopped
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: RpcError | None = None
        self._generation = LISTENER
        self.stats = ListenerStatistics()

    def start(self) -> None:
        """Start the thread and wait until its ``init2`` succeeded; RpcError when it did not."""
        if self._thread is not None:
            raise RuntimeError("listener already started")
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT):
            raise RpcError(
                ErrorCode.DEVICE_ERROR,
                operation="reverse-RPC listener start",
                reason=f"init2 did not return within {START_TIMEOUT:g} s",
            )
        if self._start_error is not None:
            raise self._start_error

    @property
    def generation(self) -> ListenerGeneration:
        """The listener interface the DSP answered on (valid once :meth:`start` returned)."""
        return self._generation

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (after the DSP process was told to exit); True if it ended."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the thread -------------------------------------------------------------
    def _run(self) -> None:
        # A signal must never interrupt this thread's INVOKE; the main thread takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            self._init()
        except Exception as exc:
            if isinstance(exc, RpcError):
                self._start_error = exc
            else:
                log.exception("reverse-RPC listener start failed")
                self._start_error = RpcError(ErrorCode.INTERNAL_ERROR, detail="listener start")
            self.stats.stopped_because = f"init2 failed: {self._start_error}"
            self._modules.close()
            return
        finally:
            self._started.set()
        try:
            self.stats.stopped_because = self._serve()
        except RpcError as exc:
            self.stats.stopped_because = str(exc)
        except Exception:  # the thread must log, not vanish silently
            log.exception("reverse-RPC listener failed")
            self.stats.stopped_because = "internal error (see log)"
        finally:
            self._modules.close()
            reason = self.stats.stopped_because
            log.log(
                logging.INFO if reason == PROCESS_EXITED else logging.WARNING,
                "reverse-RPC listener stopped",
                extra={"reason": reason},
            )
            if self._on_stopped is not None:
                self._on_stopped(reason)

    def _init(self) -> None:
        for generation in GENERATIONS:
            result = self._call(generation.handle, generation.init2_sc, (), ())
            if result.rc == 0:
                self._generation = generation
                self.stats.generation = generation.name
                log.info("reverse-RPC listener started", extra={"interface": generation.name})
                return
            if generation is LISTENER:
                raise RpcError(ErrorCode.FASTRPC, rc=result.rc)
            if result.rc not in FALLBACK_RESULTS:
                # libcdsprpc goes on to serve through handle 3, without its init2.
                self._generation = LISTENER
                self.stats.generation = LISTENER.name
                log.warning(
                    "adsp_listener1 init2 failed; serving through adsp_listener without init2",
                    extra={"result": describe_result(result.rc)},
                )
                return
            log.info(
                "no domain-style listener; using the older one",
                extra={"result": describe_result(result.rc)},
            )

    def _call(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """An INVOKE, issued again when interrupted (every call here may be repeated)."""
        while True:
            try:
                return self._invoke(handle, sc, inputs, outputs)
            except InterruptedCallError:
                self.stats.interrupted += 1
                log.warning("reverse-RPC listener call interrupted; issuing it again")

    def _serve(self) -> str:
        generation = self._generation
        ctx, result, reply = 0, -1, b""
        while True:
            try:
                res = self._next2(generation, ctx, result, reply, retry=False)
            except InterruptedCallError:
                # The reply went out with the interrupted call; start over without one.
                self.stats.interrupted += 1
                log.warning("reverse-RPC listener next2 interrupted; waiting again")
                ctx, result, reply = 0, -1, b""
                continue
            if res.rc == AEE.EINTERRUPTED:
                ctx, result, reply = 0, -1, b""
                continue
            if res.rc == AEE.EBADSTATE.dsp:
                return PROCESS_EXITED
            if res.rc != 0:
                # libcdsprpc answers a failed next2 once more, with the failure as its
                # result and no reply; a second failure ends the loop.
                self.stats.retries += 1
                log.warning(
                    "reverse-RPC listener next2 failed; retrying once",
                    extra={"result": describe_result(res.rc)},
                )
                first = res.rc
                res = self._next2(generation, ctx, first, b"", retry=True)
                if res.rc == AEE.EBADSTATE.dsp:
                    return PROCESS_EXITED
                if res.rc != 0:
                    return (
                        f"next2 answered {describe_result(first)}, then "
                        f"{describe_result(res.rc)} on the retry"
                    )
            request = generation.next2.decode(res.outputs)
            ctx = request.integer("ctx")
            answer = self._handle(
                ctx,
                request.integer("handle"),
                request.integer("sc"),
                request.integer("bufsLenReq"),
                res.output(1),
            )
            self.stats.requests += 1
            if answer.result != 0:
                self.stats.failures += 1
            result = answer.result
            reply = pack_buffers(answer.outputs) if answer.result == 0 else b""

    def _next2(
        self, generation: ListenerGeneration, ctx: int, result: int, reply: bytes, *, retry: bool
    ) -> InvokeResult:
        """next2 carrying the previous request's answer; ``retry``: issued again when
        interrupted (the retry after a failure), else InterruptedCallError goes up."""
        call = generation.next2.encode(
            prevCtx=ctx, prevResult=_signed(result), prevbufs=reply, bufs=REQUEST_CAPACITY
        )
        invoke = self._call if retry else self._invoke
        return invoke(generation.handle, call.sc, _in_args(call), _out_args(call))

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
            return self._modules.dispatch(handle, sc, inputs, caps)
        except Exception:
            # No single request may end the listener: without it no skel loads.
            log.exception("reverse call failed", extra={"sc": f"0x{sc:08X}", "handle": handle})
            return Reply(int(AEE.EFAILED))

    def _fetch(self, ctx: int, offset: int, remaining: int) -> bytes:
        capacity = min(remaining, REQUEST_CAPACITY)
        method = self._generation.get_in_bufs2
        call = method.encode(ctx=ctx, offset=offset, bufs=capacity)
        res = self._call(self._generation.handle, call.sc, _in_args(call), _out_args(call))
        if res.rc != 0:
            return b""
        available = method.decode(res.outputs).integer("bufsLenReq")
        return res.output(1)[: min(available, capacity)]


def _signed(result: int) -> int:
    """A u32 result as the s32 prevResult field carries it."""
    result &= 0xFFFFFFFF
    return result - (1 << 32) if result & 0x80000000 else result


def _in_args(call: idl.EncodedCall) -> tuple[InArg, ...]:
    """A listener call's inputs: all inline (nothing here passes a DMA-BUF)."""
    inputs = tuple(Inline(item) for item in call.inputs if isinstance(item, bytes))
    if len(inputs) != len(call.inputs):
        raise TypeError("a listener call passes only inline inputs")
    return inputs


def _out_args(call: idl.EncodedCall) -> tuple[OutArg, ...]:
    outputs = tuple(Capacity(item) for item in call.outputs if isinstance(item, int))
    if len(outputs) != len(call.outputs):
        raise TypeError("a listener call passes only inline outputs")
    return outputs

"""Reverse RPC: calls the simulated DSP makes into the session's listener.

A DSP thread (here: the thread whose remotectl-open INVOKE is loading a skel)
queues a request and waits; the listener thread, blocked in a next2 INVOKE on
handle 3, takes it, runs it on the host and brings the answer back in its next
next2. Packing follows libcdsprpc's ``listener_buf.h`` (reference 5.6):

* request blob: per input buffer a u32 length, then (if non-zero) padding to
  8 bytes from the blob start and the data; then per output buffer a u32
  capacity;
* reply blob: per output buffer a u32 length (which must equal the capacity
  asked for), then (if non-zero) padding to 8 and the data.

Everything happens on the calling threads, under one condition variable per
DSP process; nothing here starts a thread.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE
from npud.sim.errors import (
    ListenerInterruptedError,
    ProcessExitedError,
    ReverseTimeoutError,
    SubsystemDownError,
)
from npud.sim.layout import U32

_ALIGN: Final = 8


class BadReverseMessageError(Exception):
    """A reply or get_in_bufs2 request the DSP rejects (AEE_EBADPARM)."""


class ListenerNotReadyError(Exception):
    """next2 before init2."""


def _pad_to(blob: bytearray, alignment: int) -> None:
    blob.extend(bytes(-len(blob) % alignment))


def pack_request(inputs: Sequence[bytes], out_capacities: Sequence[int]) -> bytes:
    blob = bytearray()
    for data in inputs:
        blob += U32.pack(len(data))
        if data:
            _pad_to(blob, _ALIGN)
            blob += data
    for capacity in out_capacities:
        blob += U32.pack(capacity)
    return bytes(blob)


def unpack_reply(blob: bytes, out_capacities: Sequence[int]) -> list[bytes]:
    """The output buffers of a reply; each length must equal the capacity asked for."""
    outputs: list[bytes] = []
    cursor = 0
    for index, capacity in enumerate(out_capacities):
        if cursor + U32.size > len(blob):
            raise BadReverseMessageError(f"reply ends before the length of output {index}")
        (length,) = U32.unpack_from(blob, cursor)
        cursor += U32.size
        if length != capacity:
            raise BadReverseMessageError(
                f"output {index}: {length} bytes returned, {capacity} asked"
            )
        if length:
            cursor += -cursor % _ALIGN
            if cursor + length > len(blob):
                raise BadReverseMessageError(f"reply ends inside output {index}")
            outputs.append(blob[cursor : cursor + length])
            cursor += length
        else:
            outputs.append(b"")
    return outputs


@dataclasses.dataclass(eq=False)
class _Request:
    ctx: int
    handle: int
    sc: int
    blob: bytes
    out_capacities: tuple[int, ...]
    picked_up: bool = False
    done: bool = False
    result: int = 0
    outputs: list[bytes] = dataclasses.field(default_factory=list)


class ReverseReply(NamedTuple):
    result: int
    outputs: list[bytes]


class NextRequest(NamedTuple):
    """What next2 hands the listener: the request and the first ``capacity`` bytes."""

    ctx: int
    handle: int
    sc: int
    data: bytes
    needed: int


class ReverseRpc:
    """The reverse-RPC queue of one DSP process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[_Request] = collections.deque()
        self._in_service: dict[int, _Request] = {}
        self._last_ctx = 0
        self._gone: type[SubsystemDownError] | type[ProcessExitedError] | None = None
        self._listener_ready = False
        self._interrupts = 0

    # -- the DSP side --------------------------------------------------------

    def call(
        self,
        handle: int,
        sc: int,
        inputs: Sequence[bytes],
        out_capacities: Sequence[int],
        timeout: float,
    ) -> ReverseReply:
        """Run ``handle``/``sc`` in the host process and wait for its answer.

        Raises ReverseTimeoutError when no listener answers within ``timeout``,
        SubsystemDownError or ProcessExitedError when the process goes away meanwhile.
        """
        with self._cond:
            self._raise_if_gone()
            request = _Request(
                self._allocate_ctx(),
                handle,
                sc,
                pack_request(inputs, out_capacities),
                tuple(out_capacities),
            )
            self._queue.append(request)
            self._cond.notify_all()
            deadline = time.monotonic() + timeout
            try:
                while not request.done:
                    self._raise_if_gone()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ReverseTimeoutError(picked_up=request.picked_up)
                    self._cond.wait(remaining)
            finally:
                if not request.done:
                    self._forget(request)
            return ReverseReply(request.result, request.outputs)

    def _allocate_ctx(self) -> int:
        # Unique and non-zero for the life of the process (ids are not reused).
        self._last_ctx = self._last_ctx % 0xFFFF_FFFF + 1
        return self._last_ctx

    def _forget(self, request: _Request) -> None:
        if request in self._queue:
            self._queue.remove(request)
        self._in_service.pop(request.ctx, None)

    def _raise_if_gone(self) -> None:
        if self._gone is not None:
            raise self._gone()

    # -- the listener side ---------------------------------------------------

    def init_listener(self) -> None:
        with self._cond:
            self._raise_if_gone()
            self._listener_ready = True

    def next(self, prev_ctx: int, prev_result: int, prev_bufs: bytes, capacity: int) -> NextRequest:
        """Deliver the reply for ``prev_ctx`` (if any), then block until a request comes.

        Raises ProcessExitedError (the listener should stop), SubsystemDownError,
        ListenerInterruptedError (retry with ctx 0) or ListenerNotReadyError.
        """
        with self._cond:
            self._raise_if_gone()
            if not self._listener_ready:
                raise ListenerNotReadyError
            if prev_ctx:
                self._deliver(prev_ctx, prev_result, prev_bufs)
            interrupts = self._interrupts
            while not self._queue:
                self._cond.wait()
                self._raise_if_gone()
                if self._interrupts != interrupts:
                    raise ListenerInterruptedError
            request = self._queue.popleft()
            request.picked_up = True
            self._in_service[request.ctx] = request
            return NextRequest(
                request.ctx, request.handle, request.sc, request.blob[:capacity], len(request.blob)
            )

    def _deliver(self, ctx: int, result: int, blob: bytes) -> None:
        request = self._in_service.pop(ctx, None)
        if request is None:
            return  # timed out, interrupted or never issued: the DSP drops the reply
        if result != 0:
            request.result = result
        else:
            try:
                request.outputs = unpack_reply(blob, request.out_capacities)
            except BadReverseMessageError:
                request.result = AEE.EBADPARM.dsp
        request.done = True
        self._cond.notify_all()

    def get_in_bufs(self, ctx: int, offset: int, capacity: int) -> tuple[bytes, int]:
        """The packed request of ``ctx`` from ``offset``: (data, total size)."""
        with self._cond:
            self._raise_if_gone()
            request = self._in_service.get(ctx)
            if request is None:
                raise BadReverseMessageError(f"no request with ctx {ctx} is being served")
            if offset > len(request.blob):
                raise BadReverseMessageError(
                    f"offset {offset} is past the {len(request.blob)}-byte request"
                )
            return request.blob[offset : offset + capacity], len(request.blob)

    # -- lifecycle and faults ------------------------------------------------

    def shutdown(self, reason: type[SubsystemDownError] | type[ProcessExitedError]) -> None:
        """The process is gone: every waiter on either side raises ``reason``."""
        with self._cond:
            if self._gone is None:
                self._gone = reason
            self._queue.clear()
            self._in_service.clear()
            self._cond.notify_all()

    def interrupt_listeners(self) -> None:
        """Listeners blocked in next2 return AEE_EINTERRUPTED; requests they held are re-sent."""
        with self._cond:
            self._interrupts += 1
            for request in reversed(list(self._in_service.values())):
                request.picked_up = False
                request.ctx = self._allocate_ctx()
                self._queue.appendleft(request)
            self._in_service.clear()
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Requests queued or being served."""
        with self._cond:
            return len(self._queue) + len(self._in_service)

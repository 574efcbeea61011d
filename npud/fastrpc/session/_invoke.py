"""Invoke and marshal: the INVOKE ioctl and its argument array (inline bytes copied,
DMA-BUF slices pinned for the call), the scalars word checked against the arguments,
and the suspends each INVOKE waited through."""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from npu_protocol import MAX_DMA_SIZE, ErrorCode, describe_result
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError, dsp_result_in_errno_range, translate_os_error
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.session._buffers import release_quietly
from npud.fastrpc.session._device import Device
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log
from npud.fastrpc.session._mappings import check_bank

_RawBuffer = ctypes.Array[ctypes.c_char]


class Invoker:
    """The INVOKE itself, on any handle, and the suspends the INVOKEs waited through
    (each one a context of this fd that mainline keeps until the fd closes)."""

    def __init__(self, device: Device, life: Life) -> None:
        self._device = device
        self._life = life
        self._lock = threading.Lock()
        self._interrupted_done = 0
        """Suspends that INVOKEs of this fd waited through, counted when they returned."""
        self._waiting: dict[int, int] = {}
        """INVOKEs on the driver now: the driver's suspend count when each began."""
        self._waiting_ids = itertools.count()

    def counted(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """A counted invoke: close() waits for it; refused once the session is closing."""
        with self._life.call():
            return self.invoke(handle, sc, inputs, outputs)

    def invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """The INVOKE itself. The listener uses it directly: its next2 stays pending
        until the DSP process exits, which close() itself brings about."""
        check_scalars(sc, inputs, outputs)
        pinned: list[DmaBuffer] = []
        try:
            args, memory = self._marshal(inputs, outputs, pinned)
            invoke = abi.fastrpc_invoke(
                handle=handle, sc=sc, args=ctypes.addressof(args) if len(args) else 0
            )
            rc = self._invoke_ioctl(invoke)
            reported = self._device.driver.dsp_report()  # this thread's INVOKE's
            results = tuple(
                None if isinstance(arg, Slice) else (raw.raw if raw is not None else b"")
                for arg, raw in zip(outputs, memory[len(inputs) :], strict=True)
            )
            return InvokeResult(rc=rc, outputs=results, dsp_seconds=reported)
        finally:
            for buffer in pinned:
                if buffer.unpin():
                    release_quietly(buffer)

    def _invoke_ioctl(self, invoke: abi.fastrpc_invoke) -> int:
        """INVOKE; a DSP result that reached us as an errno is returned as that result.
        Suspends during the call are counted: each kept one context of this fd."""
        device = self._device
        try:
            with self._waiting_call():
                return device.driver.ioctl(device.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
        except OSError as exc:
            rc = dsp_result_in_errno_range(exc, abi.FASTRPC_IOCTL_INVOKE)
            if rc is None:
                error = translate_os_error(exc, abi.FASTRPC_IOCTL_INVOKE, device=device.name)
                if error.code is ErrorCode.DSP_RESTARTED:
                    self._life.mark_dead(str(error))
                raise error from None
            log.warning(
                "a DSP result in the errno range came back as errno",
                extra={"errno": exc.errno, "result": describe_result(rc)},
            )
            return rc

    @contextmanager
    def _waiting_call(self) -> Iterator[None]:
        """Around an INVOKE ioctl: the suspends it waits through are counted."""
        suspends = self._device.driver.suspends
        start = suspends()
        with self._lock:
            token = next(self._waiting_ids)
            self._waiting[token] = start
        try:
            yield
        finally:
            spanned = suspends() - start
            with self._lock:
                del self._waiting[token]
                self._interrupted_done += spanned

    def interrupted_contexts(self) -> int:
        """Contexts of this fd's INVOKEs that system suspends interrupted, those still
        waiting included (see FastRpcSession.interrupted_contexts)."""
        now = self._device.driver.suspends()
        with self._lock:
            return self._interrupted_done + sum(now - start for start in self._waiting.values())

    def _marshal(
        self, inputs: Sequence[InArg], outputs: Sequence[OutArg], pinned: list[DmaBuffer]
    ) -> tuple[ctypes.Array[abi.fastrpc_invoke_args], list[_RawBuffer | None]]:
        """Fill the args array; returns it and, per argument, the ctypes memory behind it."""
        args = (abi.fastrpc_invoke_args * (len(inputs) + len(outputs)))()
        memory: list[_RawBuffer | None] = []
        for slot, arg in zip(args, [*inputs, *outputs], strict=True):
            raw: _RawBuffer | None = None
            if isinstance(arg, Slice):
                check_bank(arg.buffer)
                arg.buffer.check_slice(arg.offset, arg.length)
                arg.buffer.pin()
                pinned.append(arg.buffer)
                slot.ptr = arg.buffer.host_address + arg.offset
                slot.length = arg.length
                slot.fd = arg.buffer.fd
            else:
                data = arg.data if isinstance(arg, Inline) else b""
                size = len(data) if isinstance(arg, Inline) else capacity_of(arg)
                if size:
                    raw = ctypes.create_string_buffer(data, size)
                    slot.ptr = ctypes.addressof(raw)
                slot.length = size
                slot.fd = -1
            slot.attr = 0
            memory.append(raw)
        return args, memory


def capacity_of(arg: InArg | OutArg) -> int:
    if isinstance(arg, Capacity):
        if arg.size < 0:
            raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative capacity {arg.size}")
        if arg.size > MAX_DMA_SIZE:
            raise RpcError(ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=arg.size, limit=MAX_DMA_SIZE)
        return arg.size
    raise TypeError(f"not an invoke argument: {arg!r}")


def check_scalars(sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]) -> None:
    if not 0 <= sc <= 0xFFFFFFFF:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"scalars word {sc:#x} is not u32")
    expected = (abi.remote_scalars_inbufs(sc), abi.remote_scalars_outbufs(sc))
    if expected != (len(inputs), len(outputs)):
        raise RpcError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"scalars word 0x{sc:08X} declares {expected[0]} inputs and {expected[1]} "
            f"outputs; {len(inputs)} and {len(outputs)} were given",
        )
    if abi.remote_scalars_inhandles(sc) or abi.remote_scalars_outhandles(sc):
        raise RpcError(ErrorCode.UNSUPPORTED, what="handle arguments in invokes")

"""The requests on skels: open and close a remote handle, and invoke its methods."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.domain.life import Domain
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.session import FastRpcSession
from npud.requests.clients import Client, Entry, Kind
from npud.requests.handler import Answer, CallTiming, DaemonView, Handler, Route, destroyable
from npud.requests.holdings import (
    DSPQUEUE_SIGNAL_SC,
    OpenHandle,
    is_dspqueue_uri,
    let_go,
)

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    pass


class Open(Handler[p.OpenRequest]):
    session: FastRpcSession
    route = Route.LOADER
    creates = True

    def arrive(self) -> None:
        self.session = self.domain.current()
        with self.quotas.reserving:
            self.quotas.check_handle(self.client)
            self.entry = self._reserve(Kind.HANDLE)

    def run(self) -> Answer:
        session, uri, domain = self.session, self.request.uri, self.domain
        try:
            faults = domain.device.profile.fault_methods(uri)
            handle = domain.run(session, lambda: session.remote_open(uri))
        except BaseException:
            self.client.objects.failed(self.entry)
            raise
        opened = OpenHandle(
            handle,
            domain.registry.opened(handle),
            waiting_methods(uri),
            faults,
            is_dspqueue_uri(uri),
        )
        if not self.client.objects.created(self.entry, opened):
            let_go(domain, handles=[opened])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return Answer(p.OpenReply(id=self.request.id, handle=self.entry.id))


class Close(Handler[p.CloseRequest]):
    route = Route.LOADER
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.handle, Kind.HANDLE)
        self._waits += destroyable(self.entry)

    def run(self) -> Answer:
        opened = self._handle(self.entry)
        self.client.objects.remove(self.entry)
        let_go(self.domain, handles=[opened], strict=True)
        return Answer(p.CloseReply(id=self.request.id))


# --- invoke -------------------------------------------------------------------------


class Invoke(Handler[p.InvokeRequest]):
    """A remote call. Its handle and buffers are held from arrival to the end. A call
    that waits for the DSP (``wait``) runs on the domain's waits lane."""

    session: FastRpcSession

    route = Route.DSP
    _waiting = False

    def __init__(
        self, client: Client, domain: Domain, request: p.InvokeRequest, daemon: DaemonView
    ) -> None:
        super().__init__(client, domain, request, daemon)
        if request.wait:
            self.route = Route.WAIT

    def _may_fault(self) -> None:
        """The method crashes the DSP process on purpose (the emulator's fault injection):
        root's and ``[emulator] fault_uids``' calls only (PROTOCOL.md section 7.4)."""
        client = self.client
        quotas = client.quotas
        allowed = quotas.config.emulator.fault_uids if quotas is not None else ()
        if client.uid != 0 and client.uid not in allowed:
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail=f"method {self.request.method} of handle {self.request.handle} crashes "
                "its DSP process on purpose (fault injection): for root and the users "
                "[emulator] fault_uids lists only",
            )

    def arrive(self) -> None:
        request = self.request
        self.session = self.domain.current()
        if request.wait:
            if request.timeout_ms is not None or request.deadline_ms is not None:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT,
                    detail="a call that waits for the DSP has no timeout_ms or deadline_ms",
                )
            if not self.domain.isolated:
                # Nothing but its own DSP process's end stops a wait whose client left:
                # in a shared process that would hold a waits thread for good.
                raise CodedError(
                    ErrorCode.NOT_PERMITTED,
                    detail="a call that waits for the DSP needs a DSP process of its own "
                    "(hello.isolate, or an isolating [domains] rule)",
                )
            self.client.begin_wait(MAX_WAITS)
            self._waiting = True
        limits = self.limits
        for resource, used in (
            ("inline input bytes", request.inline_input_bytes),
            ("inline output bytes", request.inline_output_bytes),
        ):
            if used > limits.max_inline_bytes:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource=resource, limit=limits.max_inline_bytes
                )
        timing = self.timing = CallTiming(
            self.client, limits, request.timeout_ms, request.deadline_ms
        )
        self.handle = self._use(request.handle, Kind.HANDLE)
        opened = self.handle.value
        if isinstance(opened, OpenHandle) and request.method in opened.faults:
            self._may_fault()  # refused at once, before a slot is given (again in run)
        self.slices = [
            (arg, self._use(arg.buffer, Kind.BUFFER))
            for arg in (*request.inputs, *request.outputs)
            if isinstance(arg, p.BufferSlice)
        ]
        for arg, entry in self.slices:
            if entry.created.is_open:
                _check_slice(arg, entry)
        timing.begin()

    @property
    def doorbell(self) -> bool:
        """Is this dspqueue's ``signal`` (an op batch's doorbell, docs/scheduling.md)?
        Asked when the call is submitted, its handle open by then."""
        if self.request.wait or self.request.scalars != DSPQUEUE_SIGNAL_SC:
            return False
        entry = self.handle
        return entry.live and isinstance(entry.value, OpenHandle) and entry.value.dspqueue

    def run(self) -> Answer:
        opened = self._handle(self.handle)
        if self.request.method in opened.faults:
            self._may_fault()
        handle = opened.handle
        if self.request.wait:
            _check_waits(self.request, opened, self.handle.id)
        buffers = {id(arg): self._held_buffer(entry).buffer for arg, entry in self.slices}
        for arg, entry in self.slices:
            _check_slice(arg, entry)

        def argument(arg: p.InputArg | p.OutputArg) -> InArg | OutArg:
            if isinstance(arg, p.InlineInput):
                return Inline(arg.data)
            if isinstance(arg, p.InlineOutput):
                return Capacity(arg.capacity)
            return Slice(buffers[id(arg)], arg.offset, arg.length)

        request, session = self.request, self.session
        inputs = [argument(arg) for arg in request.inputs]
        outputs = [argument(arg) for arg in request.outputs]
        started = time.perf_counter()
        try:
            result: InvokeResult = self.domain.run(
                session,
                lambda: session.invoke(handle, request.scalars, inputs, outputs),  # type: ignore[arg-type]
            )
        finally:
            self.dsp_seconds = time.perf_counter() - started
        self.reported_dsp_seconds = result.dsp_seconds
        if result.rc != 0:
            raise CodedError(ErrorCode.INVOKE_FAILED, code=result.rc)
        return Answer(p.InvokeReply(id=request.id, outputs=result.outputs))

    def end(self) -> None:
        if self._waiting:
            self._waiting = False
            self.client.end_wait()
        if self.timing is not None:
            self.timing.end()
        super().end()


MAX_WAITS: Final = 2
"""Calls of one client that wait for the DSP at once (dspqueue keeps one)."""
WAITING_METHODS: Final[Mapping[str, frozenset[int]]] = MappingProxyType(
    {"libdspqueue_rpc_skel.so": frozenset({6})}  # dspqueue_rpc.wait_signal
)
"""By skel library, the methods that wait for the DSP (until it has something to say)
rather than compute: what ``invoke.wait`` is for. A call with ``wait`` takes no slot
and escapes the watchdog, so a method that computes may not be sent with it."""


def waiting_methods(uri: str) -> frozenset[int]:
    """The methods of the skel ``uri`` names that wait for the DSP (none for most)."""
    library = uri.partition("?")[0].rpartition("/")[2]
    return WAITING_METHODS.get(library, frozenset())


def _check_waits(request: p.InvokeRequest, opened: OpenHandle, handle_id: int) -> None:
    method = (request.scalars >> 24) & 0x1F
    if method not in opened.waits:
        raise CodedError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"wait is only for a method that waits for the DSP (dspqueue's "
            f"wait_signal); method {method} of handle {handle_id} computes: send it "
            "without wait",
        )


def _check_slice(arg: p.BufferSlice, entry: Entry) -> None:
    """Slices are checked against the allocated size, the one size the client was told."""
    if entry.live and arg.offset + arg.length > entry.size:
        raise CodedError(
            ErrorCode.SLICE_OUT_OF_RANGE,
            offset=arg.offset,
            length=arg.length,
            buffer=entry.id,
            size=entry.size,
        )


# --- models (npud/requests/models.py) ------------------------------------------------------------

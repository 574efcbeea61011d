"""The requests on buffers: alloc, free, map and unmap (the domain's control lane)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import npu_protocol as p
from npu_client.transport import OwnedFd
from npu_protocol import CodedError, ErrorCode
from npud.fastrpc.kernel.dma import checked_dma_size
from npud.fastrpc.session import FastRpcSession
from npud.requests.clients import Kind
from npud.requests.handler import Answer, Handler, Route, destroyable
from npud.requests.holdings import (
    HeldBuffer,
    let_go,
)

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    pass


class Alloc(Handler[p.AllocRequest]):
    route = Route.CONTROL
    creates = True

    def arrive(self) -> None:
        largest = self.quotas.config.client_limits.max_buffer_size
        if self.request.size > largest:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="buffer size", limit=largest)
        size = checked_dma_size(self.request.size)
        with self.quotas.reserving:
            self.quotas.check_buffer(self.client, size)
            self.entry = self._reserve(Kind.BUFFER, size)

    def run(self) -> Answer:
        domain, client, objects = self.domain, self.client, self.client.objects
        memory = domain.device.require_memory()
        scope = memory.pool.scope(client, client.uid)
        try:
            buffer, mapping = memory.allocate(
                self.entry.size, scope, domain.registry, self._fallback, taker=client
            )
        except BaseException:
            objects.failed(self.entry)
            raise
        held = HeldBuffer(buffer, mapping)
        try:
            # The reply's fd is a dup made now, before any later request can free
            # the buffer: the reply must carry this buffer's file, never whatever
            # file reuses a closed fd number.
            reply_fd = OwnedFd(os.dup(buffer.fd))
        except OSError as exc:
            objects.failed(self.entry)
            let_go(domain, buffers=[held])
            raise CodedError(
                ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
            ) from None
        if not objects.created(self.entry, held):
            reply_fd.close()
            let_go(domain, buffers=[held])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        reply = p.AllocReply(
            id=self.request.id,
            buffer=self.entry.id,
            size=buffer.size,
            fd=reply_fd.fileno(),
            dsp_fd=buffer.fd,
        )
        return Answer(reply, reply_fd)


class Free(Handler[p.FreeRequest]):
    route = Route.CONTROL
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.buffer, Kind.BUFFER)
        self._waits += destroyable(self.entry)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        self.client.objects.remove(self.entry)
        domain, client = self.domain, self.client
        memory = domain.device.require_memory()
        mapping = held.live_mapping()
        held.mapping = None
        if not client.pools_freed_buffers:
            # Version 1 promised that freed memory lives on until the client's fd and
            # mapping are gone: never hand it to anyone else (PROTOCOL.md 7.2).
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
            return Answer(p.FreeReply(id=self.request.id))
        if mapping is not None and not memory.pool.settings.keep_dsp_mappings:
            # The pool keeps buffers unmapped: unmap now, then offer it.
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
            return Answer(p.FreeReply(id=self.request.id))
        scope = memory.pool.scope(client, client.uid)
        if not memory.free(scope, held.buffer, mapping, domain.control.submit, client) and mapping:
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
        return Answer(p.FreeReply(id=self.request.id))


class Map(Handler[p.MapRequest]):
    session: FastRpcSession
    route = Route.CONTROL

    def arrive(self) -> None:
        self.session = self.domain.current()
        self.entry = self._use(self.request.buffer, Kind.BUFFER)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        address = held.dsp_address
        if address is None:
            session, registry, flags = self.session, self.domain.registry, self.request.flags
            mapping = self.domain.run(session, lambda: registry.map(session, held.buffer, flags))
            held.mapping = mapping
            address = mapping.address
        return Answer(p.MapReply(id=self.request.id, dsp_address=address))


class Unmap(Handler[p.UnmapRequest]):
    route = Route.CONTROL
    acquires = False

    def arrive(self) -> None:
        self.entry = self._use(self.request.buffer, Kind.BUFFER)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        mapping = held.live_mapping()
        if mapping is None:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT, detail=f"buffer id {self.entry.id} is not mapped"
            )
        domain = self.domain
        session = domain.session
        if session is None:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        domain.run(session, lambda: domain.registry.unmap(session, mapping, going=False))
        held.mapping = None
        return Answer(p.UnmapReply(id=self.request.id))


# --- skels --------------------------------------------------------------------------

"""The least machinery that serves llama.cpp's op batches: bench/batch_rtt.py's baseline.

What npud does for a program on its libcdsprpc, without npud: one blocking thread
per connection reads requests (``recvmsg``), decodes them with the same
``npu_protocol`` objects and makes the same ``FastRpcSession`` calls on the same
emulator (the same shell loaded, one DSP process per connection as npud's own
domain gives a ``background`` llama.cpp): ``alloc``, ``free``, ``map``, ``unmap``,
``open``, ``close`` and ``invoke``. A ``wait`` invoke (dspqueue's
``wait_signal``, which blocks until the DSP answers a batch) runs on a thread of
its own (one per connection, started with it: the shim keeps one ``wait``
outstanding), since the client rings the doorbell (``signal``) while it waits;
every other request is answered on the reading thread. No scheduler, no tables beyond
the ids, no quotas, no accounting.

Run as ``python -m bench.batch_server SOCKET [DSP_UNITS [HMX_UNITS]]``; it serves
until killed. (A benchmark baseline, not a daemon: no limits, and an error is
answered with the session's error code and nothing else.)
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import sys
import threading

import npu_protocol as p
from npu_client.transport import ANCILLARY_SPACE, RECV_BUFFER, fds_ancillary
from npud.domain.life import capabilities_record
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, OutArg, Slice
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.requests.holdings import is_dspqueue_uri
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.skels_dspqueue import SC_CANCEL_WAIT_SIGNAL


class _Connection:
    """One client: its socket, its DSP process (session), its buffers and handles."""

    def __init__(self, sock: socket.socket, driver: EmulatedDriver) -> None:
        self.sock = sock
        self.conn = p.ServerConnection()
        self.session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
        self.session.load_shell(DEV_SHELL.read_bytes())
        self.buffers: dict[int, DmaBuffer] = {}
        self.handles: dict[int, int] = {}
        self.queue_handles: list[int] = []  # dspqueue_rpc's
        self.send_lock = threading.Lock()
        self.waits: queue.SimpleQueue[p.InvokeRequest | None] = queue.SimpleQueue()
        self.waiter = threading.Thread(target=self._wait_loop, daemon=True)
        self.waiter.start()

    def _wait_loop(self) -> None:
        while (request := self.waits.get()) is not None:
            self.answer(request)

    def send(self, reply: p.ServerMessage) -> None:
        with self.send_lock, contextlib.suppress(OSError):  # OSError: the client is gone
            out, fds = self.conn.send(reply)
            self.sock.sendmsg([out], fds_ancillary(fds))

    def serve(self) -> None:
        try:
            while True:
                data, _, _, _ = self.sock.recvmsg(RECV_BUFFER, ANCILLARY_SPACE)
                with self.send_lock:
                    self.conn.receive_data(data)
                while True:
                    with self.send_lock:
                        event = self.conn.next_event()
                    if event is p.NEED_DATA or isinstance(event, p.ConnectionClosed):
                        break
                    if isinstance(event, p.InvokeRequest) and event.wait:
                        self.waits.put(event)
                    else:
                        self.answer(event)
                if not data:
                    return
        finally:
            self.waits.put(None)
            # The client is gone with a wait_signal outstanding (the shim keeps one),
            # which would hold the session open: cancel it (npud ends the process).
            for handle in self.queue_handles:
                with contextlib.suppress(RpcError):
                    self.session.invoke(handle, SC_CANCEL_WAIT_SIGNAL, [], [])
            self.session.close()
            self.waiter.join()
            self.sock.close()

    def answer(self, event: object) -> None:
        if not isinstance(event, p.Request | p.Hello):
            return
        try:
            reply = self._reply(event)
        except RpcError as exc:
            assert isinstance(event, p.Request)
            reply = p.ErrorMessage.for_code(exc.code, id=event.id, **exc.fields)
        self.send(reply)

    def _reply(self, event: p.Request | p.Hello) -> p.ServerMessage:
        session = self.session
        if isinstance(event, p.Hello):
            return p.Welcome(
                server_version="batch-floor",
                protocol_version=min(event.protocol_version, p.PROTOCOL_VERSION),
                backend="emulator",
                dsp=capabilities_record(session.capabilities),
                limits=p.ClientLimits(priority=event.priority),
                epoch=1,
            )
        if isinstance(event, p.InvokeRequest):
            inputs: list[InArg] = [
                Inline(a.data)
                if isinstance(a, p.InlineInput)
                else Slice(self.buffers[a.buffer], a.offset, a.length)
                for a in event.inputs
            ]
            outputs: list[OutArg] = [
                Capacity(a.capacity)
                if isinstance(a, p.InlineOutput)
                else Slice(self.buffers[a.buffer], a.offset, a.length)
                for a in event.outputs
            ]
            result = session.invoke(self.handles[event.handle], event.scalars, inputs, outputs)
            if result.rc:
                return p.ErrorMessage.for_code(
                    p.ErrorCode.INVOKE_FAILED, id=event.id, code=result.rc
                )
            return p.InvokeReply(id=event.id, outputs=result.outputs)
        if isinstance(event, p.AllocRequest):
            buffer = session.alloc(event.size)
            self.buffers[buffer.id] = buffer
            return p.AllocReply(
                id=event.id, buffer=buffer.id, size=buffer.size, fd=buffer.fd, dsp_fd=buffer.fd
            )
        if isinstance(event, p.FreeRequest):
            session.free(self.buffers.pop(event.buffer))
            return p.FreeReply(id=event.id)
        if isinstance(event, p.MapRequest):
            address = session.map(self.buffers[event.buffer], event.flags)
            return p.MapReply(id=event.id, dsp_address=address)
        if isinstance(event, p.UnmapRequest):
            session.unmap(self.buffers[event.buffer])
            return p.UnmapReply(id=event.id)
        if isinstance(event, p.OpenRequest):
            handle_id = len(self.handles) + 1
            self.handles[handle_id] = session.remote_open(event.uri)
            if is_dspqueue_uri(event.uri):
                self.queue_handles.append(self.handles[handle_id])
            return p.OpenReply(id=event.id, handle=handle_id)
        if isinstance(event, p.CloseRequest):
            session.remote_close(self.handles.pop(event.handle))
            return p.CloseReply(id=event.id)
        return p.ErrorMessage.for_code(
            p.ErrorCode.UNSUPPORTED, id=event.id, what="the batch floor serves llama.cpp only"
        )


def main(argv: list[str]) -> None:
    path = argv[0]
    units = int(argv[1]) if len(argv) > 1 else 0
    hmx = int(argv[2]) if len(argv) > 2 else 0
    driver = EmulatedDriver(SimConfig(dsp_units=units, hmx_units=hmx))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print(f"READY {os.getpid()}", flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=lambda s=sock: _Connection(s, driver).serve(), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])

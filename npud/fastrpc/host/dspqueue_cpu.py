"""The CPU side of dspqueue, in Python, for the emulator's tests and benches.

A port of what qualcomm/fastrpc's ``src/dspqueue/dspqueue_cpu.c`` does on the CPU
(the library llama.cpp's Hexagon backend calls), over a :class:`FastRpcSession`:

* the first queue of a session opens ``libdspqueue_rpc_skel.so``, maps a 1 KiB
  process state block and passes its fd to ``init_process_state`` (method 2), and
  starts the two signal threads of RPC signalling: one sends ``signal`` (method 8)
  when asked, one keeps a ``wait_signal`` (method 6) outstanding and, when it
  returns, compares the state block's ``resp_packet_count`` / ``req_space_count``
  with what it saw and wakes the readers and writers waiting for them; -1 ends it;
* a queue is one buffer (header, request ring, its two states, response ring, its
  two states, 256-byte aligned), mapped with FASTRPC_MAP_FD, created on the DSP
  twice: first with version UINT32_MAX (a DSP that checks versions refuses it with
  AEE_EUNSUPPORTED), then with version 2 and WAIT_COUNTS;
* packets are written and read with the library's header, wrap and position
  rules; a writer signals only when the DSP's reader advertises a wait count, a
  reader that must wait advertises its own;
* closing the last queue cancels ``wait_signal`` and joins the threads.

The layouts are written out here from ``inc/dspqueue_shared.h``, apart from the
emulator's own description in :mod:`npud.sim.dspqueue`, so a drift in either fails
the tests. Blocking calls take a guard (seconds) after which they fail the test
instead of hanging it; no test relies on it to pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Final

from npu_protocol import AEE, ErrorCode
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession

URI: Final = (
    "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0"
    "&_dom=cdsp&_session=0"
)
SC_INIT_PROCESS_STATE: Final = 0x02010000
SC_CREATE_QUEUE: Final = 0x03010100
SC_DESTROY_QUEUE: Final = 0x04010000
SC_IS_IMPORTED: Final = 0x05010100
SC_WAIT_SIGNAL: Final = 0x06000100
SC_CANCEL_WAIT_SIGNAL: Final = 0x07000000
SC_SIGNAL: Final = 0x08000000

GUARD: Final = 60.0
"""Seconds after which a blocking call fails the test (it would hang otherwise)."""

MESSAGE: Final = 0x01
BUFFERS: Final = 0x02
WAKEUP: Final = 0x04
USER_READY: Final = 0x10
HEADER_VERSION: Final = 2
WAIT_COUNTS: Final = 1
MAX_BUFFERS: Final = 64
MAX_MESSAGE: Final = 65536
MAX_QUEUES: Final = 64

_ALIGN: Final = 256
_HEADER: Final = struct.Struct("<IiIIIIIIIIII")  # version, error, flags, req[4], resp[4], count
_STATE: Final = struct.Struct("<III")  # position, packet_count, wait_count
_BUFFER: Final = struct.Struct("<IIIIQ")
_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
_U64: Final = struct.Struct("<Q")
_CREATE: Final = struct.Struct("<IiI")
_STATE_BLOCK: Final = 4 * MAX_QUEUES * 4
_REQ_PACKET, _REQ_SPACE, _RESP_PACKET, _RESP_SPACE = 0, 1, 2, 3


class CpuQueueError(Exception):
    """A dspqueue call failed with ``code`` (an AEE result)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {code:#x}")
        self.code = code


class WouldBlockError(CpuQueueError):
    def __init__(self, what: str) -> None:
        super().__init__(what, AEE.EWOULDBLOCK)


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


def _pad8(size: int) -> int:
    return (size + 7) & ~7


@dataclasses.dataclass(frozen=True)
class Buffer:
    """struct dspqueue_buffer."""

    fd: int
    size: int = 0
    offset: int = 0
    flags: int = 0
    ptr: int = 0


@dataclasses.dataclass(frozen=True)
class Packet:
    flags: int
    buffers: tuple[Buffer, ...]
    message: bytes


def _answer_under(error: RpcError) -> int:
    """What libcdsprpc's own call would have answered where npud's session raised:
    the session turns the DSP process's end (AEE_EBADSTATE, with the listener
    stopping) into DSP_RESTARTED; anything else is a plain failure."""
    return AEE.EBADSTATE.dsp if error.code is ErrorCode.DSP_RESTARTED else AEE.EFAILED


class CpuQueues:
    """The dspqueue state of one CPU process for one domain (``dspqueue_domain_queues``)."""

    def __init__(self, session: FastRpcSession, *, receive: bool = True) -> None:
        """``receive``: keep a wait_signal outstanding (the library always does; without
        it, nothing of the CPU waits in the DSP process)."""
        self.session = session
        self.handle = session.remote_open(URI)
        self.mapped: dict[int, DmaBuffer] = {}
        """fastrpc_buffer_ref's table: buffers mapped to the DSP, by fd."""
        self._state_buffer = self.map(session.alloc(_STATE_BLOCK))
        self.state = self._state_buffer.view()
        self.state[:_STATE_BLOCK] = bytes(_STATE_BLOCK)
        rc = self._invoke(SC_INIT_PROCESS_STATE, [_I32.pack(self._state_buffer.fd)])[0]
        if rc:
            raise CpuQueueError("init_process_state", rc)
        self._lock = threading.Lock()
        self.queues: dict[int, CpuQueue] = {}
        self._count = 0
        self.wakeup = threading.Condition()
        """Notified whenever wait_signal returns (and when the receive thread ends)."""
        self.error = 0
        self.signals_sent = 0
        self.signals_received = 0
        self.reported = 0.0
        """DSP seconds the DSP reported with its wait_signal answers (the emulator's;
        ``Driver.dsp_report``)."""
        self._send = threading.Condition()
        self._send_pending = False
        self._send_stop = False
        self.closed = False
        self._receiver = threading.Thread(
            target=self._receive_loop, name="dspqueue-cpu-recv", daemon=True
        )
        self._sender = threading.Thread(
            target=self._send_loop, name="dspqueue-cpu-send", daemon=True
        )
        self._receiving = receive
        if receive:
            self._receiver.start()
        self._sender.start()

    def map(self, buffer: DmaBuffer) -> DmaBuffer:
        """fastrpc_mmap(FASTRPC_MAP_FD) of a buffer the CPU's packets may name."""
        self.session.map(buffer)
        self.mapped[buffer.fd] = buffer
        return buffer

    def unmap(self, buffer: DmaBuffer) -> None:
        self.mapped.pop(buffer.fd, None)
        self.session.unmap(buffer)

    # -- RPC -------------------------------------------------------------------------------

    def _invoke(self, sc: int, inputs: Sequence[bytes], out: int = 0) -> tuple[int, bytes]:
        outputs = [Capacity(out)] if out else []
        result = self.session.invoke(self.handle, sc, [Inline(d) for d in inputs], outputs)
        return result.rc, (result.outputs[0] or b"") if out else b""

    def create_queue_raw(self, slot: int, fd: int, count: int) -> tuple[int, int]:
        rc, data = self._invoke(SC_CREATE_QUEUE, [_CREATE.pack(slot, fd, count)], 8)
        return rc, _U64.unpack(data)[0] if rc == 0 else 0

    def destroy_queue_raw(self, qid: int) -> int:
        return self._invoke(SC_DESTROY_QUEUE, [_U64.pack(qid)])[0]

    def is_imported(self, qid: int) -> int:
        rc, data = self._invoke(SC_IS_IMPORTED, [_U64.pack(qid)], 4)
        if rc:
            raise CpuQueueError("is_imported", rc)
        return int(_I32.unpack(data)[0])

    # -- the state block -------------------------------------------------------------------

    def state_count(self, array: int, slot: int) -> int:
        return int(_U32.unpack_from(self.state, (array * MAX_QUEUES + slot) * 4)[0])

    def set_state_count(self, array: int, slot: int, value: int) -> None:
        _U32.pack_into(self.state, (array * MAX_QUEUES + slot) * 4, value & 0xFFFFFFFF)

    # -- the signal threads ------------------------------------------------------------------

    def send_signal(self) -> None:
        with self._send:
            self._send_pending = True
            self._send.notify()

    def _send_loop(self) -> None:
        while True:
            with self._send:
                while not (self._send_pending or self._send_stop):
                    self._send.wait()
                if self._send_stop:
                    return
                self._send_pending = False
            try:
                rc = self._invoke(SC_SIGNAL, [])[0]
            except RpcError as exc:
                rc = _answer_under(exc)
            if rc:
                self._fail(rc)
                return
            self.signals_sent += 1

    def _receive_loop(self) -> None:
        while True:
            try:
                result = self.session.invoke(self.handle, SC_WAIT_SIGNAL, [], [Capacity(4)])
            except RpcError as exc:  # the session went away under the call
                self._fail(_answer_under(exc))
                return
            rc, data = result.rc, result.outputs[0] or b""
            self.reported += result.dsp_seconds or 0.0
            if rc:
                self._fail(rc)
                return
            (signal,) = _I32.unpack(data)
            if signal == -1:
                with self.wakeup:
                    self.wakeup.notify_all()
                return
            self.signals_received += 1
            with self._lock:
                queues = list(self.queues.values())
            for queue in queues:
                queue.signalled()
            with self.wakeup:
                self.wakeup.notify_all()

    def _fail(self, code: int) -> None:
        """A signal call failed (the DSP process died...): every waiter gives up."""
        self.error = code or AEE.EFAILED
        with self._lock:
            queues = list(self.queues.values())
        for queue in queues:
            queue.signalled()
        with self.wakeup:
            self.wakeup.notify_all()

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait until ``condition`` holds, looking again at each signal of the DSP."""
        with self.wakeup:
            if not self.wakeup.wait_for(lambda: condition() or bool(self.error), GUARD):
                raise AssertionError(f"never happened: {what}")
        if not condition():
            raise CpuQueueError(f"signal thread failed while waiting for {what}", self.error)

    # -- queues ------------------------------------------------------------------------------

    def create(self, req_size: int = 2560, resp_size: int = 6656) -> CpuQueue:
        """dspqueue_create with the version handshake; ``first_create`` keeps the result of
        the probe with version UINT32_MAX."""
        with self._lock:
            slot = next(i for i in range(MAX_QUEUES) if i not in self.queues)
            count = self._count
            self._count += 1
        queue = CpuQueue(self, slot, count, req_size, resp_size)
        with self._lock:
            self.queues[slot] = queue
        try:
            queue.create_on_dsp()
        except BaseException:
            with self._lock:
                del self.queues[slot]
            queue.free()
            raise
        return queue

    def forget(self, queue: CpuQueue) -> None:
        with self._lock:
            self.queues.pop(queue.slot, None)

    def close(self) -> None:
        """After the last queue: cancel wait_signal, join the threads, let go of the rest."""
        rc = self._invoke(SC_CANCEL_WAIT_SIGNAL, [])[0] if not self.error else 0
        self.join_receiver()
        with self._send:
            self._send_stop = True
            self._send.notify()
        self._sender.join(GUARD)
        self.abandon()
        if rc:
            raise CpuQueueError("cancel_wait_signal", rc)

    def let_go(self) -> None:
        """Let go of the CPU's own views and threads only (the session's close then
        releases the buffers and ends the DSP process, as a process's exit does)."""
        self.closed = True
        with self._send:
            self._send_stop = True
            self._send.notify()
        self._sender.join(GUARD)
        for queue in list(self.queues.values()):
            queue.memory.release()
        self.state.release()

    def abandon(self) -> None:
        """Let go of the CPU's resources without asking the DSP (its process died)."""
        self.closed = True
        with self._send:
            self._send_stop = True
            self._send.notify()
        self._sender.join(GUARD)
        for queue in list(self.queues.values()):
            queue.free()
        self.state.release()
        with contextlib.suppress(RpcError):
            self.session.remote_close(self.handle)
        with contextlib.suppress(RpcError):
            self.unmap(self._state_buffer)
        with contextlib.suppress(RpcError):
            self.session.free(self._state_buffer)

    def join_receiver(self) -> None:
        if not self._receiving:
            return
        self._receiver.join(GUARD)
        assert not self._receiver.is_alive(), "the receive thread did not end"


class CpuQueue:
    """One queue, the CPU's end (``struct dspqueue``)."""

    def __init__(
        self, domain: CpuQueues, slot: int, count: int, req_size: int, resp_size: int
    ) -> None:
        self.domain = domain
        self.slot = slot
        self.count = count
        self.req_size = req_size
        self.resp_size = resp_size
        self.size = _aligned(_HEADER.size) + 4 * _aligned(_STATE.size)
        self.size += _aligned(req_size) + _aligned(resp_size)
        self.buffer = domain.map(domain.session.alloc(self.size))
        self.memory = self.buffer.view()
        self.memory[: self.size] = bytes(self.size)
        offset = _aligned(_HEADER.size)
        self.req_offset = offset
        offset += _aligned(req_size)
        self.req_read, self.req_write = offset, offset + _aligned(_STATE.size)
        offset += 2 * _aligned(_STATE.size)
        self.resp_offset = offset
        offset += _aligned(resp_size)
        self.resp_read, self.resp_write = offset, offset + _aligned(_STATE.size)
        offset += 2 * _aligned(_STATE.size)
        assert offset == self.size
        self.write_header(1, 0)
        self.qid = 0
        self.first_create = 0
        self.seq = 0
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._space = threading.Condition()  # dspqueue_cpu.c's space mutex and cond
        self._packets = threading.Condition()  # its packet mutex and cond
        self.req_space_count = 0  # as last seen in the state block
        self.resp_packet_count = 0
        self._req_packets = 0
        self._resp_space = 0
        self.writer_waiting = threading.Event()
        """Set by a blocking write just before it waits for space (for tests)."""
        domain.set_state_count(_REQ_PACKET, slot, 0)
        domain.set_state_count(_RESP_SPACE, slot, 0)

    def write_header(self, version: int, flags: int) -> None:
        _HEADER.pack_into(
            self.memory,
            0,
            version,
            0,
            flags,
            self.req_offset,
            self.req_size,
            self.req_read,
            self.req_write,
            self.resp_offset,
            self.resp_size,
            self.resp_read,
            self.resp_write,
            self.count,
        )

    def create_on_dsp(self) -> None:
        """The handshake of dspqueue_create."""
        _U32.pack_into(self.memory, 0, 0xFFFFFFFF)
        rc, qid = self.domain.create_queue_raw(self.slot, self.buffer.fd, self.count)
        self.first_create = rc
        if rc not in (AEE.EUNSUPPORTED, AEE.EUNSUPPORTED.dsp):
            raise CpuQueueError("create_queue with version UINT32_MAX did not fail as expected", rc)
        _U32.pack_into(self.memory, 0, HEADER_VERSION)
        _U32.pack_into(self.memory, 8, WAIT_COUNTS)
        rc, qid = self.domain.create_queue_raw(self.slot, self.buffer.fd, self.count)
        if rc:
            raise CpuQueueError("create_queue", rc)
        self.qid = qid

    @property
    def error(self) -> int:
        """The header's ``error`` field (where the emulated DSP says why it stopped)."""
        return int(_I32.unpack_from(self.memory, 4)[0])

    def state(self, offset: int) -> tuple[int, int, int]:
        position, packets, waits = _STATE.unpack_from(self.memory, offset)
        return int(position), int(packets), int(waits)

    def _set_position(self, offset: int, position: int, packets: int) -> None:
        _U32.pack_into(self.memory, offset, position)
        _U32.pack_into(self.memory, offset + 4, packets & 0xFFFFFFFF)

    def _add_wait(self, offset: int, by: int) -> None:
        waits = self.state(offset)[2] + by
        _U32.pack_into(self.memory, offset + 8, waits)

    # -- signals from the receive thread -------------------------------------------------

    def _space_changed(self, seen: int) -> Callable[[], bool]:
        return lambda: self.req_space_count != seen or bool(self.domain.error)

    def _packets_changed(self, seen: int) -> Callable[[], bool]:
        return lambda: self.resp_packet_count != seen or bool(self.domain.error)

    def signalled(self) -> None:
        domain = self.domain
        with self._packets:
            count = domain.state_count(_RESP_PACKET, self.slot)
            if count != self.resp_packet_count or domain.error:
                self.resp_packet_count = count
                self._packets.notify_all()
        with self._space:
            count = domain.state_count(_REQ_SPACE, self.slot)
            if count != self.req_space_count or domain.error:
                self.req_space_count = count
                self._space.notify_all()

    # -- writing ---------------------------------------------------------------------------

    def _find(self, fd: int) -> DmaBuffer | None:
        """fastrpc_buffer_ref: a buffer of this process mapped to the DSP."""
        return self.domain.mapped.get(fd)

    def write_noblock(
        self, buffers: Sequence[Buffer] = (), message: bytes = b"", flags: int = 0
    ) -> None:
        if len(buffers) > MAX_BUFFERS or len(message) > MAX_MESSAGE:
            raise CpuQueueError("write", AEE.EBADPARM)
        flags = flags | BUFFERS if buffers else flags & ~BUFFERS
        flags = flags | MESSAGE if message else flags & ~MESSAGE
        length = 8 + 24 * len(buffers) + len(message)
        size = _pad8(length)
        if size > self.req_size - 8:
            raise CpuQueueError("write: packet too large for the queue", AEE.EBADPARM)
        with self._write_lock:
            read, write = self.state(self.req_read)[0], self.state(self.req_write)[0]
            if read == write:
                space = self.req_size - 8
            elif write > read:
                space = self.req_size - write + read - 8
            else:
                space = read - write - 8
            if space < size:
                raise WouldBlockError("write")
            wrap = self.req_size - write < size
            if wrap and space - (self.req_size - write) < size:
                raise WouldBlockError("write")
            for buffer in buffers:
                found = self._find(buffer.fd)
                if found is None:
                    raise CpuQueueError(f"write: buffer fd {buffer.fd} not mapped", AEE.ENOSUCHMAP)
                if buffer.size and buffer.offset + buffer.size > found.size:
                    raise CpuQueueError("write: buffer range", AEE.EBADPARM)
                if not buffer.size and buffer.offset:
                    raise CpuQueueError("write: buffer offset without a size", AEE.EBADPARM)
            flags |= USER_READY
            raw = length | (flags & 0xFFFF) << 32 | (len(buffers) & 0xFF) << 48
            raw |= (self.seq & 0xFF) << 56
            self._put(write, raw, buffers, message, wrap)

    def write_raw(self, raw: int, payload: bytes) -> None:
        """Put a header and bytes at the write position without any check (for packets a
        DSP must refuse), publish them and signal."""
        with self._write_lock:
            write = self.state(self.req_write)[0]
            base = self.req_offset
            _U64.pack_into(self.memory, base + write, raw)
            self.memory[base + write + 8 : base + write + 8 + len(payload)] = payload
            position = write + 8 + _pad8(len(payload))
            self._publish(0 if position >= self.req_size else position)

    def _put(
        self, write: int, raw: int, buffers: Sequence[Buffer], message: bytes, wrap: bool
    ) -> None:
        base = self.req_offset
        _U64.pack_into(self.memory, base + write, raw)
        position = write + 8
        if position >= self.req_size:
            position = 0
        if wrap:
            _U64.pack_into(self.memory, base, raw)
            position = 8
        for buffer in buffers:
            _BUFFER.pack_into(
                self.memory,
                base + position,
                buffer.fd,
                buffer.size,
                buffer.offset,
                buffer.flags,
                buffer.ptr,
            )
            position += 24
        if message:
            self.memory[base + position : base + position + len(message)] = message
            position += _pad8(len(message))
        self._publish(0 if position >= self.req_size else position)

    def _publish(self, position: int) -> None:
        packets = self.state(self.req_write)[1] + 1
        self._set_position(self.req_write, position, packets)
        self._req_packets += 1
        self.domain.set_state_count(_REQ_PACKET, self.slot, self._req_packets)
        if self.state(self.req_read)[2]:  # the DSP's reader may be waiting
            self.domain.send_signal()
        self.seq += 1

    def write(self, buffers: Sequence[Buffer] = (), message: bytes = b"", flags: int = 0) -> None:
        """A blocking write (fails the test after GUARD seconds)."""
        with self._space:
            seen = self.req_space_count
            try:
                self.write_noblock(buffers, message, flags)
                return
            except WouldBlockError:
                pass
            self._add_wait(self.req_write, 1)
            try:
                while True:
                    try:
                        self.write_noblock(buffers, message, flags)
                        return
                    except WouldBlockError:
                        pass
                    self.writer_waiting.set()
                    if not self._space.wait_for(self._space_changed(seen), GUARD):
                        raise AssertionError("a blocking write never got space")
                    if self.domain.error:
                        raise CpuQueueError("write", self.domain.error)
                    seen = self.req_space_count
            finally:
                self._add_wait(self.req_write, -1)

    # -- reading ---------------------------------------------------------------------------

    def read_noblock(self) -> Packet:
        with self._read_lock:
            while True:
                read, write = self.state(self.resp_read)[0], self.state(self.resp_write)[0]
                if read == write:
                    raise WouldBlockError("read")
                available = write - read if write > read else self.resp_size - read + write
                base = self.resp_offset
                (raw,) = _U64.unpack_from(self.memory, base + read)
                length = raw & 0xFFFFFFFF
                flags = (raw >> 32) & 0xFFFF
                count = (raw >> 48) & 0xFF if flags & BUFFERS else 0
                if length < 8 + 24 * count:
                    raise CpuQueueError("read: bad packet length", AEE.EBADITEM)
                message_length = length - 8 - 24 * count if flags & MESSAGE else 0
                if self.resp_size - read < length:
                    assert available - (self.resp_size - read) >= length
                    position = 8
                else:
                    position = read + 8
                if not flags & USER_READY:
                    raise CpuQueueError("read: packet not ready", AEE.EBADITEM)
                buffers = []
                for index in range(count):
                    fd, size, offset, bflags, _ = _BUFFER.unpack_from(
                        self.memory, base + position + 24 * index
                    )
                    found = self._find(fd)
                    if found is None:
                        raise CpuQueueError(f"read: buffer fd {fd} not mapped", AEE.ENOSUCHMAP)
                    size = size or found.size
                    buffers.append(Buffer(fd, size, offset, bflags, found.host_address + offset))
                position += 24 * count
                message = bytes(self.memory[base + position : base + position + message_length])
                position += _pad8(message_length)
                if position >= self.resp_size:
                    position = 0
                packets = self.state(self.resp_read)[1] + 1
                self._set_position(self.resp_read, position, packets)
                self._resp_space += 1
                self.domain.set_state_count(_RESP_SPACE, self.slot, self._resp_space)
                if self.state(self.resp_write)[2]:  # the DSP's writer may be waiting
                    self.domain.send_signal()
                if flags & WAKEUP:
                    continue
                return Packet(flags, tuple(buffers), message)

    def read(self) -> Packet:
        """A blocking read (fails the test after GUARD seconds)."""
        with self._packets:
            seen = self.resp_packet_count
            try:
                return self.read_noblock()
            except WouldBlockError:
                pass
            self._add_wait(self.resp_read, 1)
            try:
                while True:
                    try:
                        return self.read_noblock()
                    except WouldBlockError:
                        pass
                    if not self._packets.wait_for(self._packets_changed(seen), GUARD):
                        raise AssertionError("a blocking read never got a packet")
                    if self.domain.error:
                        raise CpuQueueError("read", self.domain.error)
                    seen = self.resp_packet_count
            finally:
                self._add_wait(self.resp_read, -1)

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """dspqueue_close: refused while the DSP still has it imported."""
        domain = self.domain
        if domain.is_imported(self.qid):
            raise CpuQueueError("close: still imported on the DSP", AEE.EBADPARM)
        rc = domain.destroy_queue_raw(self.qid)
        if rc:
            raise CpuQueueError("destroy_queue", rc)
        domain.forget(self)
        self.free()

    def free(self) -> None:
        self.memory.release()
        with contextlib.suppress(RpcError):
            self.domain.unmap(self.buffer)
        with contextlib.suppress(RpcError):
            self.domain.session.free(self.buffer)

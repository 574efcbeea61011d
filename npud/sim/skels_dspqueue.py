"""The DSP side of dspqueue: the queues of a DSP process, as the ``dspqueue_rpc`` skel
(:mod:`npud.sim.skels_dspqueue_rpc`) and DSP code use them.

qualcomm/fastrpc's CPU library (``src/dspqueue/dspqueue_cpu.c``) opens
``libdspqueue_rpc_skel.so`` once per domain and drives the DSP's half of its
shared-memory queues through it; DSP code (ggml's htp worker) imports a queue by
its id and reads requests from it and writes responses to it. Without the
kernel's dspsignal (mainline), signals are RPC calls: the CPU calls ``signal``
after it wrote a packet the DSP may wait for, and keeps one ``wait_signal``
outstanding that returns when the DSP has something for it.

``interface dspqueue_rpc : remote_handle64`` (qaic stub ``dspqueue_rpc_stub.c``):

=====================================  ==  ==========  ===================  ==========
method                                 #   sc          primIn               primROut
=====================================  ==  ==========  ===================  ==========
init_process_state(i32 fd)             2   0x02010000  fd (4 B)
create_queue(u32 id, i32 fd, u32 n,    3   0x03010100  id, fd, count (12 B)  u64 queue id
rout u64 queue_id)
destroy_queue(u64 queue_id)            4   0x04010000  8 B
is_imported(u64 queue_id, rout i32)    5   0x05010100  8 B                  i32 (4 B)
wait_signal(rout i32 signal)           6   0x06000100                       i32 (4 B)
cancel_wait_signal()                   7   0x07000000
signal()                               8   0x08000000
=====================================  ==  ==========  ===================  ==========

What this DSP does (one :class:`DspQueueService` per DSP process, shared by every
handle of the process; queue slots 0..63 and the signals belong to the process):

* ``init_process_state`` maps the 1 KiB process state block by the fd of its
  MEM_MAP; ``create_queue`` maps the queue by its fd and checks its header:
  a version other than 1 or 2, or flags other than WAIT_COUNTS, is
  AEE_EUNSUPPORTED (the CPU's first create, with version UINT32_MAX, must fail
  so; it then creates with version 2 and WAIT_COUNTS), a layout that does not
  fit the buffer, a slot in use or out of range, a header ``queue_count`` other
  than the call's, or no process state is AEE_EBADPARM; an fd without a MEM_MAP
  is AEE_ENOSUCHMAP. The id returned names the slot and a serial.
* Requests are read with the exact header, wrap and position rules
  (:mod:`npud.sim.dspqueue`); each one read bumps ``req_space_count[slot]`` and
  signals the CPU if its writer waits (``req`` write state ``wait_count``).
  From ``create_queue`` on, the ``req`` read state ``wait_count`` stays 1: the
  DSP may be waiting at any time, so the CPU signals after every write (its
  store of the packet and its look at the count are ordered by its barrier, the
  DSP's 1 by the create call's round trip), and no packet waits unseen.
  ``signal`` wakes every reader of the process to look at its queues.
* A response written bumps ``resp_packet_count[slot]`` and always signals the
  CPU (an extra wake-up is harmless). A signal completes the outstanding
  ``wait_signal`` with 0 (signals before one is outstanding are remembered,
  several as one); ``cancel_wait_signal`` makes ``wait_signal`` return -1,
  now and until the next ``init_process_state``.
* A packet the DSP refuses (no USER_READY, a header that does not fit, a buffer
  whose fd has no MEM_MAP in the process or reaches past it) is not consumed: the
  queue stops being served, its header's ``error`` holds the AEE code
  (AEE_EBADITEM, AEE_ENOSUCHMAP), its importer's reads fail, and the CPU is
  signalled.
* A ``wait_signal`` answer of 0 reports (``SkelCall.report_dsp_seconds``) the DSP
  time of the process's pieces of work (below) that ended since the previous
  answer, each from its start until the model credited it: the driver hands it to
  its caller (``Driver.dsp_report``), and npud charges it to the batches the
  answer ends (docs/scheduling.md). A device's kernel has no such report.
* Each event wakes only its waiters (one lock, a condition per kind of waiter): a
  signal the queues' readers and writers, a response, a cancel or a piece of work
  the CPU's ``wait_signal``, a piece's end the thread that waits for it. Every
  woken thread takes the GIL, so a needless wake-up delays the thread the event
  is for (docs/emulator.md).
* A DSP writer waiting for response space re-checks every 50 ms besides the CPU's
  signals: the CPU signals only when it sees the writer's ``wait_count``, which
  Python cannot order against its own read of the ring with a memory barrier.
* DSP code's packet handling is DSP work (:meth:`QueueEndpoint.computing`): when
  the emulator models the DSP's shared compute (``SimConfig.dsp_units`` /
  ``hmx_units``), each piece joins the model when it starts and its answer waits
  until the model credited the CPU time it took on the host, beside the calls and the
  other DSP processes' work. A thread of the DSP process reaches the driver only
  through a call, so the outstanding ``wait_signal`` carries the pieces: it
  begins and ends them on the driver's side while it waits, and does not return
  while a piece it began runs. Without a ``wait_signal`` outstanding (or once it
  is cancelled) a piece runs uncharged, as every piece did before the model.
* Closing the handle that made the process state (the CPU does it after the last
  queue) cancels ``wait_signal``, destroys the queues it created and lets go of
  the state block; the PD's end does the same for everything.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE
from npud.sim import dspqueue as dq
from npud.sim.pd_services import FdMemory, NoSuchMapError, PdResident, PdServices
from npud.sim.skels import ComputeMeter

log = logging.getLogger(__name__)

SKEL_NAME: Final = "dspqueue_rpc"
URI: Final = "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0"

SC_INIT_PROCESS_STATE: Final = 0x02010000
SC_CREATE_QUEUE: Final = 0x03010100
SC_DESTROY_QUEUE: Final = 0x04010000
SC_IS_IMPORTED: Final = 0x05010100
SC_WAIT_SIGNAL: Final = 0x06000100
SC_CANCEL_WAIT_SIGNAL: Final = 0x07000000
SC_SIGNAL: Final = 0x08000000

SIGNAL_CANCELLED: Final = -1
WRITER_RECHECK: Final = 0.05
"""Seconds between a waiting DSP writer's looks at the ring (see the module docstring)."""

_QUEUE_ID_SLOT_BITS: Final = 8


class Signal(NamedTuple):
    """What ``wait_signal`` answers: ``value`` (0, or -1 once cancelled) and
    ``dsp_seconds``, the DSP time of the process's pieces of work (``computing``)
    that ended since the last answer, each from its start until the model credited
    it: the op batches answered, as the DSP counts them."""

    value: int
    dsp_seconds: float


class QueueClosedError(Exception):
    """The import was closed, or its queue destroyed or failed: nothing more to read."""


@dataclasses.dataclass(eq=False)
class _Queue:
    slot: int
    qid: int
    memory: FdMemory
    header: dq.QueueHeader
    owner: object
    request: dq.Ring
    response: dq.Ring
    imported: int = 0
    failed: int = 0
    closed: bool = False
    seq: int = 0

    def release(self) -> None:
        self.closed = True
        self.request.release()
        self.response.release()
        self.memory.close()


class _Charge:
    """A piece of DSP work of a thread of the process, carried by a ``wait_signal``."""

    __slots__ = ("carrier", "job", "matrix", "seconds", "settled", "started")

    def __init__(self, matrix: bool) -> None:
        self.matrix = matrix
        self.started = time.monotonic()  # the model counts it from here, not the begin
        self.carrier: object = None  # the wait_signal that began it
        self.job: int | None = None  # its number on that carrier's meter
        self.seconds: float | None = None  # set when it ends
        self.settled = False  # ended (charged, or let go uncharged)


class DspQueueService(PdResident):
    """The dspqueue library of one DSP process (see the module docstring). Thread-safe:
    one lock guards the queues and the signals; ring accesses happen under it."""

    def __init__(self, pd: PdServices) -> None:
        super().__init__(pd)
        self._lock = threading.Lock()
        # One lock, a condition per kind of waiter: a notify wakes only the threads it
        # concerns, so a doorbell's wake-up of the queue's reader does not also wake
        # the CPU's wait_signal, nor a response the reader (each woken thread takes
        # the GIL from the one the wake-up is for; the device's DSP has no such cost).
        self._readers = threading.Condition(self._lock)
        """DSP code waiting on a queue: to read (a signal), to write (space), or for
        the queue's or the import's end."""
        self._cpu = threading.Condition(self._lock)
        """The CPU's ``wait_signal``: something for the CPU, a cancel, a piece of work
        to carry."""
        self._settled = threading.Condition(self._lock)
        """Pieces of work waiting for their carrier to end them (``charge_end``)."""
        self._state_memory: FdMemory | None = None
        self._state: dq.ProcessState | None = None
        self._state_owner: object = None
        self._queues: dict[int, _Queue] = {}  # by slot
        self._serials = itertools.count(1)
        self._pending = False  # something for the CPU since its last wait_signal
        self._cancelled = False
        self._doorbell = 0  # signals from the CPU
        self._ended = False
        self._carriers = 0  # wait_signal calls outstanding with a meter
        self._charges: collections.deque[_Charge] = collections.deque()  # to begin or end
        self._open: list[_Charge] = []  # begun on a carrier, not ended
        self.charged = 0  # pieces the model credited
        self.uncharged = 0  # pieces run with no carrier
        self._worked = 0.0
        """Seconds of DSP work (pieces ended) since the CPU's last ``wait_signal``
        returned: what the next one reports (:class:`Signal`)."""

    # -- the RPC methods --------------------------------------------------------------------

    def init_process_state(self, fd: int, owner: object) -> int:
        try:
            memory = self.pd.map_fd(fd)
        except NoSuchMapError:
            return AEE.ENOSUCHMAP.dsp
        try:
            state = dq.ProcessState(memory.view)
        except dq.QueueError as exc:
            memory.close()
            log.warning("dspqueue init_process_state refused", extra={"reason": str(exc)})
            return exc.code
        with self._lock:
            self._check_locked()
            old_state, old_memory = self._state, self._state_memory
            self._state, self._state_memory, self._state_owner = state, memory, owner
            self._cancelled = False
            self._pending = False
            self._worked = 0.0  # an earlier CPU session's, answered to no one now
        if old_state is not None and old_memory is not None:
            old_state.release()
            old_memory.close()
        return 0

    def create_queue(self, slot: int, fd: int, count: int, owner: object) -> tuple[int, int]:
        """(AEE result, queue id)."""
        try:
            memory = self.pd.map_fd(fd)
        except NoSuchMapError:
            return AEE.ENOSUCHMAP.dsp, 0
        try:
            header = dq.read_header(memory.view)
            code = self._check_new(header, memory, slot, count)
            if code:
                memory.close()
                return code, 0
            with self._lock:
                self._check_locked()
                if self._state is None or slot in self._queues:
                    memory.close()
                    why = "no process state" if self._state is None else f"slot {slot} in use"
                    log.warning("dspqueue create_queue refused", extra={"reason": why})
                    return AEE.EBADPARM.dsp, 0
                qid = (next(self._serials) << _QUEUE_ID_SLOT_BITS) | slot
                queue = _Queue(
                    slot,
                    qid,
                    memory,
                    header,
                    owner,
                    dq.Ring(memory.view, header.request),
                    dq.Ring(memory.view, header.response),
                )
                self._state.set(dq.RESP_PACKET_COUNT, slot, 0)
                self._state.set(dq.REQ_SPACE_COUNT, slot, 0)
                if header.wait_counts:
                    queue.request.set_reader_waits(1)  # the DSP may wait: always signal
                self._queues[slot] = queue
                return 0, qid
        except dq.QueueError as exc:
            memory.close()
            log.warning("dspqueue create_queue refused", extra={"reason": str(exc)})
            return exc.code, 0

    @staticmethod
    def _check_new(header: dq.QueueHeader, memory: FdMemory, slot: int, count: int) -> int:
        if header.version not in (1, dq.CURRENT_VERSION) or (header.version == 1 and header.flags):
            return AEE.EUNSUPPORTED.dsp  # the CPU's probe for a DSP that checks versions
        if header.flags & ~dq.FLAG_WAIT_COUNTS:
            return AEE.EUNSUPPORTED.dsp  # driver signaling (dspsignal): not on this DSP
        if slot >= dq.MAX_PROCESS_QUEUES or header.queue_count != count:
            log.warning(
                "dspqueue create_queue refused",
                extra={"slot": slot, "count": count, "header_count": header.queue_count},
            )
            return AEE.EBADPARM.dsp
        dq.check_layout(header, len(memory.view))
        return 0

    def destroy_queue(self, qid: int) -> int:
        with self._lock:
            self._check_locked()
            queue = self._find_locked(qid)
            if queue is None or queue.imported:
                return AEE.EBADPARM.dsp
            del self._queues[queue.slot]
            queue.release()
            self._readers.notify_all()
        return 0

    def is_imported(self, qid: int) -> tuple[int, int]:
        with self._lock:
            self._check_locked()
            queue = self._find_locked(qid)
            if queue is None:
                return AEE.EBADPARM.dsp, 0
            return 0, 1 if queue.imported else 0

    def wait_signal(self, meter: ComputeMeter | None = None) -> Signal:
        """Block until there is something for the CPU: 0, or -1 once cancelled, with the
        DSP time of the pieces of work that ended since the last one returned. With a
        ``meter`` (the call's), carry the process's pieces of work meanwhile (see the
        module docstring)."""
        me = object()
        with self._lock:
            if meter is not None:
                self._carriers += 1
                self._settled.notify_all()
            try:
                while True:
                    if self._ended:
                        break
                    if self._cancelled:
                        return Signal(SIGNAL_CANCELLED, 0.0)
                    if meter is not None and self._charges:
                        self._carry_locked(self._charges.popleft(), meter, me)
                        continue
                    if self._pending and not any(c.carrier is me for c in self._open):
                        self._pending = False
                        worked, self._worked = self._worked, 0.0
                        return Signal(0, worked)
                    self._cpu.wait()
                self._check_locked()
                return Signal(SIGNAL_CANCELLED, 0.0)  # not reached: _check_locked raised
            finally:
                if meter is not None:
                    self._carriers -= 1
                    for charge in [c for c in self._open if c.carrier is me]:
                        self._open.remove(charge)  # its job goes with this call
                        charge.carrier = None
                    self._settled.notify_all()

    def _carry_locked(self, charge: _Charge, meter: ComputeMeter, me: object) -> None:
        """Begin or end ``charge`` on the driver's side (the lock released meanwhile)."""
        if charge.job is None:  # to begin
            self._lock.release()
            try:
                job = meter.begin(charge.matrix, charge.started)
            finally:
                self._lock.acquire()
            charge.job, charge.carrier = job, me
            self._open.append(charge)
            return
        if charge.carrier is not me:  # its carrier left: it runs uncharged
            charge.settled = True
            self.uncharged += 1
            self._settled.notify_all()
            return
        self._open.remove(charge)
        assert charge.seconds is not None
        self._lock.release()
        try:
            meter.end(charge.job, charge.seconds)
        finally:
            self._lock.acquire()
            charge.settled = True
            self.charged += 1
            self._settled.notify_all()

    def charge_begin(self, matrix: bool) -> _Charge | None:
        """A thread of the process starts a piece of DSP work; None when no
        ``wait_signal`` carries (the piece runs uncharged)."""
        with self._lock:
            if not self._carriers or self._ended:
                self.uncharged += 1
                return None
            charge = _Charge(matrix)
            self._charges.append(charge)
            self._cpu.notify_all()
            return charge

    def charge_end(self, charge: _Charge, seconds: float) -> None:
        """The piece took ``seconds`` on the host: wait until the model credited it (or
        its carrier left: then at once)."""
        with self._lock:
            charge.seconds = seconds
            if charge.job is None and charge.carrier is None and not self._carriers:
                with contextlib.suppress(ValueError):
                    self._charges.remove(charge)  # never begun
                self.uncharged += 1
                return
            self._charges.append(charge)
            self._cpu.notify_all()
            while not charge.settled:
                if self._ended:
                    return
                if charge.carrier is None and not self._carriers:
                    with contextlib.suppress(ValueError):
                        self._charges.remove(charge)
                    self.uncharged += 1
                    return
                self._settled.wait()

    def worked(self, seconds: float) -> None:
        """A piece of work of the process ended after ``seconds`` on the DSP (its start
        to the model's credit): the next ``wait_signal`` reports it."""
        with self._lock:
            self._worked += seconds

    def cancel_wait_signal(self) -> None:
        with self._lock:
            self._cancelled = True
            self._cpu.notify_all()

    def signal(self) -> None:
        """The CPU wrote something: every reader and writer of the process looks again."""
        with self._lock:
            self._doorbell += 1
            self._readers.notify_all()

    def release_owner(self, owner: object) -> None:
        """The handle ``owner`` closes: its queues and the state it made go."""
        released: list[_Queue] = []
        state: tuple[dq.ProcessState, FdMemory] | None = None
        with self._lock:
            for slot, queue in list(self._queues.items()):
                if queue.owner is owner:
                    del self._queues[slot]
                    released.append(queue)
            if self._state_owner is owner and self._state is not None:
                assert self._state_memory is not None
                state = self._state, self._state_memory
                self._state = self._state_memory = self._state_owner = None
                self._cancelled = True
            for queue in released:
                queue.release()
            self._readers.notify_all()
            self._cpu.notify_all()
        if state is not None:
            state[0].release()
            state[1].close()

    def pd_ended(self) -> None:
        with self._lock:
            self._ended = True
            queues, self._queues = list(self._queues.values()), {}
            for queue in queues:
                queue.release()
            if self._state is not None and self._state_memory is not None:
                self._state.release()
                self._state_memory.close()
            self._state = self._state_memory = self._state_owner = None
            for condition in (self._readers, self._cpu, self._settled):
                condition.notify_all()

    # -- importing (DSP code) ---------------------------------------------------------------

    def import_queue(self, qid: int) -> QueueEndpoint:
        """The DSP's end of queue ``qid``, for one consumer at a time (dspqueue_import).
        dq.QueueError: AEE_EBADPARM for an unknown id, AEE_EITEMBUSY when imported."""
        with self._lock:
            self._check_locked()
            queue = self._find_locked(qid)
            if queue is None:
                raise dq.QueueError(f"no queue {qid:#x} in this process", AEE.EBADPARM.dsp)
            if queue.imported:
                raise dq.QueueError(f"queue {qid:#x} is already imported", AEE.EITEMBUSY.dsp)
            queue.imported += 1
            return QueueEndpoint(self, queue)

    # -- internals --------------------------------------------------------------------------

    def _check_locked(self) -> None:
        if self._ended:
            raise self.pd.end_error()

    def _find_locked(self, qid: int) -> _Queue | None:
        queue = self._queues.get(qid & ((1 << _QUEUE_ID_SLOT_BITS) - 1))
        return queue if queue is not None and queue.qid == qid else None

    def _signal_cpu_locked(self) -> None:
        self._pending = True
        self._cpu.notify_all()

    def _fail_locked(self, queue: _Queue, error: dq.QueueError) -> None:
        """The DSP stops serving ``queue``: the reason goes to its header and the CPU."""
        queue.failed = error.code
        with contextlib.suppress(ValueError):  # released meanwhile
            dq.write_error(queue.memory.view, error.code)
        log.warning(
            "dspqueue: the DSP refuses a packet and stops serving the queue",
            extra={"queue": f"{queue.qid:#x}", "reason": str(error), "code": f"{error.code:#x}"},
        )
        self._readers.notify_all()
        self._signal_cpu_locked()


class QueueEndpoint:
    """What dspqueue_import gives DSP code: read requests, write responses, close."""

    def __init__(self, service: DspQueueService, queue: _Queue) -> None:
        self._service = service
        self._queue = queue
        self._closed = False
        self.qid = queue.qid

    def read(self) -> dq.Packet:
        """The next request, waiting for one (a signal of the CPU wakes the wait).
        QueueClosedError once closed, destroyed or failed; the PD's end error at its end."""
        service = self._service
        with service._lock:
            while True:
                self._check_locked()
                seen = service._doorbell
                packet = self._take_locked()
                if packet is not None:
                    return packet
                while seen == service._doorbell and not self._stopped_locked():
                    service._readers.wait()

    @contextlib.contextmanager
    def computing(self, *, matrix: bool = False) -> Iterator[None]:
        """The block is DSP work of this consumer (handling a packet, on the host's
        CPUs): charged to the DSP's shared compute through the process's
        ``wait_signal`` (the module docstring), at the CPU time its thread spent in the
        block (as ``SkelCall.computing``); ``matrix``: it needs the HMX too."""
        began = time.monotonic()
        charge = self._service.charge_begin(matrix)
        cpu = time.thread_time()
        try:
            yield
        finally:
            if charge is not None:
                self._service.charge_end(charge, time.thread_time() - cpu)
            self._service.worked(time.monotonic() - began)

    def read_nowait(self) -> dq.Packet | None:
        with self._service._lock:
            self._check_locked()
            return self._take_locked()

    def write(
        self,
        buffers: Sequence[dq.QueueBuffer],
        message: bytes,
        flags: int = 0,
        *,
        block: bool = True,
    ) -> bool:
        """Write a response (False: no space and ``block`` is False). dq.QueueError for a
        packet that can never fit; QueueClosedError / the PD's end error as :meth:`read`."""
        service = self._service
        queue = self._queue
        waiting = False
        with service._lock:
            try:
                while True:
                    self._check_locked()
                    seen = service._doorbell
                    if queue.response.write(flags, buffers, message, queue.seq):
                        queue.seq = (queue.seq + 1) & 0xFF
                        state = service._state
                        if state is not None:
                            state.bump(dq.RESP_PACKET_COUNT, queue.slot)
                        service._signal_cpu_locked()
                        return True
                    if not block:
                        return False
                    if queue.header.wait_counts and not waiting:
                        queue.response.add_writer_wait(1)
                        waiting = True
                        continue  # look once more now that the CPU can see the wait
                    if seen == service._doorbell and not self._stopped_locked():
                        service._readers.wait(WRITER_RECHECK)
            finally:
                if waiting and not queue.closed:
                    queue.response.add_writer_wait(-1)

    def close(self) -> None:
        """dspqueue_close of the import: the CPU may destroy the queue now."""
        service = self._service
        with service._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.imported -= 1
            service._readers.notify_all()

    def _stopped_locked(self) -> bool:
        queue = self._queue
        return self._closed or queue.closed or bool(queue.failed) or self._service._ended

    def _check_locked(self) -> None:
        self._service._check_locked()
        queue = self._queue
        if self._closed:
            raise QueueClosedError(f"the import of queue {self.qid:#x} is closed")
        if queue.closed:
            raise QueueClosedError(f"queue {self.qid:#x} was destroyed")
        if queue.failed:
            raise QueueClosedError(f"queue {self.qid:#x} failed ({queue.failed:#x})")

    def _take_locked(self) -> dq.Packet | None:
        service = self._service
        queue = self._queue
        try:
            # The one field of the header the DSP checks on each read (the whole
            # header is parsed once, at create_queue).
            (count,) = dq.U32.unpack_from(queue.memory.view, dq.QUEUE_COUNT_OFFSET)
            if queue.header.queue_count != count:
                raise dq.QueueError("the queue's header changed its queue_count", AEE.ERPC.dsp)
            while True:
                packet = queue.request.peek()
                if packet is None:
                    return None
                self._check_buffers(packet.buffers)
                queue.request.consume(packet)
                state = service._state
                if state is not None:
                    state.bump(dq.REQ_SPACE_COUNT, queue.slot)
                if not queue.header.wait_counts or queue.request.writer_waits():
                    service._signal_cpu_locked()
                if packet.flags & dq.PACKET_WAKEUP:
                    continue  # an early-wakeup packet: its reader handles it itself
                return packet
        except dq.QueueError as exc:
            service._fail_locked(queue, exc)
            raise QueueClosedError(str(exc)) from None

    def _check_buffers(self, buffers: Sequence[dq.QueueBuffer]) -> None:
        for buffer in buffers:
            try:
                with self._service.pd.map_fd(buffer.fd) as memory:
                    size = len(memory.buffer)
            except NoSuchMapError:
                raise dq.QueueError(
                    f"buffer fd {buffer.fd} is not mapped into this process", AEE.ENOSUCHMAP.dsp
                ) from None
            if (buffer.size == 0 and buffer.offset) or buffer.offset + buffer.size > size:
                raise dq.QueueError(
                    f"buffer fd {buffer.fd} [{buffer.offset}, +{buffer.size}) is outside its"
                    f" {size}-byte mapping",
                    AEE.EBADITEM.dsp,
                )


def service_of(pd: PdServices) -> DspQueueService:
    """The dspqueue library of the DSP process ``pd``."""
    return pd.resident(DspQueueService)

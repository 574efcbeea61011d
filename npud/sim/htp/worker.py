"""The batch worker of an htp session: op batches from the session's dspqueue, run in order.

Each request packet carries an ``htp_opbatch_req`` and one buffer reference: a slot
of the op-queue buffer holding the batch's buffer, tensor and op descriptors
(:mod:`npud.sim.htp.layout`). The worker maps the buffers by their fds (the DSP's
``HAP_mmap``; a mapping is kept for later batches until ``munmap`` or the session's
end), makes numpy views of the tensors over them, runs the ops in order (an op's
outputs are the inputs of later ones) and answers with an ``htp_opbatch_rsp`` and
the same buffer reference (flags FLUSH_SENDER | INVALIDATE_RECIPIENT):

* status 1 (OK) when every op ran; otherwise the first failure's status, the
  later ops still running, as on the DSP: NO_SUPPORT (3) for an op or type the
  emulator does not implement, INVAL_PARAMS (4) for descriptors that do not fit
  (shapes, types, indexes, a tensor past its buffer or whose elements, packed, hold
  more bytes than its buffer from its offset: zero strides cannot make an op copy
  more than the buffer holds; an op whose scratch would pass
  :data:`~npud.sim.htp.tensors.MAX_SCRATCH_BYTES`), INTERNAL_ERR (2) for anything
  else; each failure is logged with the op's name. Every tensor of an op is checked
  before the op allocates anything;
* INVAL_PARAMS, without running an op, for a batch naming a buffer fd the DSP process
  has no MEM_MAP of, a buffer larger than its mapping, or a buffer reference too small
  for the descriptors (the real DSP aborts or does not answer);
* a request that is not a batch (a message shorter than 24 bytes, not exactly one
  buffer) is logged and not answered, as on the DSP.

With the profiler on (htp_iface ``profiler``), each op's ``htp_prof_desc`` gets its
opcode and its time in microseconds; cycles and PMU counters are 0.

Running a batch's ops is DSP work (:meth:`QueueEndpoint.computing`): when the
emulator models the DSP's shared compute, a batch holds an HVX context, and the
HMX unit too when it has a matrix op (MUL_MAT and its variants, FLASH_ATTN_EXT),
beside the calls and the other DSP processes' batches; its answer waits until
the model credited the time its ops took.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Final

import numpy as np

from npud.sim import dspqueue
from npud.sim.htp import layout
from npud.sim.htp.layout import Op, Status
from npud.sim.htp.opcall import OpCall
from npud.sim.htp.ops import OPS
from npud.sim.htp.tensors import InvalidParamsError, OpError, Tensor
from npud.sim.pd_services import FdMemory, NoSuchMapError, PdServices
from npud.sim.skels_dspqueue import QueueClosedError, QueueEndpoint

log = logging.getLogger("npud.sim.htp")

MAX_MAPPINGS: Final = 64
"""HTP_MAX_MMAPS: the DSP keeps at most this many buffers mapped."""
RESPONSE_BUFFER_FLAGS: Final = dspqueue.BUFFER_FLUSH_SENDER | dspqueue.BUFFER_INVALIDATE_RECIPIENT
MATRIX_OPS: Final = frozenset(
    {
        Op.MUL_MAT,
        Op.MUL_MAT_ID,
        Op.MUL_MAT_NX,
        Op.MUL_MAT_ID_NX,
        Op.MUL_MAT_ADD,
        Op.FLASH_ATTN_EXT,
    }
)
"""Ops that run on the HMX unit (``SimConfig.hmx_units``)."""


class _Mapping:
    __slots__ = ("dropped", "memory", "users")

    def __init__(self, memory: FdMemory) -> None:
        self.memory = memory
        self.users = 0
        self.dropped = False


class Mappings:
    """The session's buffers mapped by fd (``ctx->mmap``), shared by the worker and the
    ``mmap`` / ``munmap`` methods. Thread-safe; a mapping a batch uses is closed after
    the batch when ``munmap`` dropped it meanwhile."""

    def __init__(self, pd: PdServices) -> None:
        self._pd = pd
        self._lock = threading.Lock()
        self._by_fd: dict[int, _Mapping] = {}

    def map(self, fd: int) -> None:
        """htp_iface_mmap: map now (kept until munmap). NoSuchMapError."""
        with self._lock:
            if fd in self._by_fd:
                return
        memory = self._pd.map_fd(fd)
        with self._lock:
            if fd not in self._by_fd:
                self._by_fd[fd] = _Mapping(memory)
                return
        memory.close()

    def acquire(self, fds: Sequence[int]) -> list[FdMemory]:
        """The memories of ``fds`` for one batch (mapped now if new, unused mappings
        dropped first when the table would overflow); NoSuchMapError (nothing held)."""
        held: list[int] = []
        try:
            found: list[FdMemory] = []
            for fd in fds:
                found.append(self._acquire(fd, fds))
                held.append(fd)
            return found
        except BaseException:
            self.release(held)
            raise

    def _acquire(self, fd: int, batch: Sequence[int]) -> FdMemory:
        with self._lock:
            entry = self._by_fd.get(fd)
            if entry is not None:
                entry.users += 1
                return entry.memory
        memory = self._pd.map_fd(fd)
        closing: list[FdMemory] = []
        with self._lock:
            entry = self._by_fd.get(fd)
            if entry is not None:
                closing.append(memory)
            else:
                if len(self._by_fd) >= MAX_MAPPINGS:
                    for other, mapping in list(self._by_fd.items()):
                        if mapping.users == 0 and other not in batch:
                            del self._by_fd[other]
                            closing.append(mapping.memory)
                entry = self._by_fd[fd] = _Mapping(memory)
            entry.users += 1
            result = entry.memory
        for stale in closing:
            stale.close()
        return result

    def release(self, fds: Sequence[int]) -> None:
        closing: list[FdMemory] = []
        with self._lock:
            for fd in fds:
                entry = self._by_fd.get(fd)
                if entry is None:
                    continue
                entry.users -= 1
                if entry.dropped and entry.users == 0:
                    del self._by_fd[fd]
                    closing.append(entry.memory)
        for memory in closing:
            memory.close()

    def unmap(self, fd: int) -> None:
        """htp_iface_munmap: the DSP lets go of its mapping of ``fd`` (after the batch that
        uses it, if one does)."""
        with self._lock:
            entry = self._by_fd.get(fd)
            if entry is None:
                return
            if entry.users:
                entry.dropped = True
                return
            del self._by_fd[fd]
        entry.memory.close()

    def close(self) -> None:
        """Every mapping goes (no batch runs any more)."""
        with self._lock:
            entries, self._by_fd = list(self._by_fd.values()), {}
        for entry in entries:
            entry.memory.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_fd)


class BatchWorker:
    """Serves one imported queue until it is closed (see the module docstring)."""

    def __init__(self, endpoint: QueueEndpoint, mappings: Mappings) -> None:
        self.endpoint = endpoint
        self.mappings = mappings
        self.profiler = 0
        self.batches = 0

    def run(self) -> None:
        while True:
            try:
                packet = self.endpoint.read()
            except QueueClosedError:
                return
            response = self._serve(packet)
            if response is None:
                continue
            try:
                self.endpoint.write(*response)
            except QueueClosedError:
                return
            except dspqueue.QueueError as exc:
                log.error("htp: the response does not fit the queue", extra={"error": str(exc)})

    def _serve(self, packet: dspqueue.Packet) -> tuple[list[dspqueue.QueueBuffer], bytes] | None:
        if len(packet.message) < layout.REQ.size or len(packet.buffers) != 1:
            log.error(
                "htp: invalid request",
                extra={"size": len(packet.message), "n_dbufs": len(packet.buffers)},
            )
            return None
        request = layout.BatchRequest(*layout.REQ.unpack_from(packet.message))
        reference = packet.buffers[0]
        started = time.monotonic()
        try:
            status = self._run_batch(request, reference)
        except InvalidParamsError as exc:
            log.error(
                "htp: batch refused",
                extra={"seq": request.seq, "status": "INVAL_PARAMS", "reason": str(exc)},
            )
            status = Status.INVAL_PARAMS
        self.batches += 1
        usecs = min(int((time.monotonic() - started) * 1e6), 0xFFFFFFFF)
        answer = layout.pack_response(
            request.seq, status, request.n_bufs, request.n_tensors, request.n_ops, usecs
        )
        returned = reference._replace(flags=RESPONSE_BUFFER_FLAGS)
        return [returned], answer

    def _run_batch(self, request: layout.BatchRequest, reference: dspqueue.QueueBuffer) -> int:
        if request.n_bufs > layout.MAX_BUFS or request.n_tensors > layout.MAX_TENSORS:
            raise InvalidParamsError(
                f"{request.n_bufs} buffers, {request.n_tensors} tensors in one batch"
            )
        try:
            (block,) = self.mappings.acquire([reference.fd])
        except NoSuchMapError as exc:
            raise InvalidParamsError(str(exc)) from None
        try:
            size = reference.size or len(block.buffer) - reference.offset
            needed = layout.batch_bytes(request)
            if size < needed or reference.offset + size > len(block.buffer):
                raise InvalidParamsError(
                    f"a batch block of {size} bytes at {reference.offset} (needs {needed})"
                )
            region = block.buffer[reference.offset : reference.offset + size]
            try:
                return self._run_region(request, region)
            finally:
                region.release()
        finally:
            self.mappings.release([reference.fd])

    def _run_region(self, request: layout.BatchRequest, region: memoryview) -> int:
        offset = 0
        buffers = []
        for _ in range(request.n_bufs):
            buffers.append(layout.BufDesc(*layout.BUF_DESC.unpack_from(region, offset)))
            offset += layout.BUF_DESC.size
        descs = []
        for _ in range(request.n_tensors):
            descs.append(layout.unpack_tensor(region, offset))
            offset += layout.TENSOR.size
        ops = []
        for _ in range(request.n_ops):
            ops.append(layout.unpack_op(region, offset))
            offset += layout.OP_DESC.size
        profile = region[offset : offset + layout.PROF_DESC.size * request.n_ops]
        fds = [buffer.fd for buffer in buffers]
        try:
            memories = self.mappings.acquire(fds)
        except NoSuchMapError as exc:
            raise InvalidParamsError(f"batch {request.seq}: {exc}") from None
        try:
            for buffer, memory in zip(buffers, memories, strict=True):
                if buffer.size > len(memory.buffer):
                    raise InvalidParamsError(
                        f"buffer fd {buffer.fd} of {buffer.size} bytes is mapped with"
                        f" {len(memory.buffer)}"
                    )
            tensors = []
            for index, desc in enumerate(descs):
                if desc.bi >= len(buffers):
                    raise InvalidParamsError(f"tensor {index} names buffer {desc.bi}")
                tensors.append(Tensor(index, desc, memories[desc.bi].buffer))
            return self._run_ops(request, ops, tensors, profile)
        finally:
            self.mappings.release(fds)
            profile.release()

    def _run_ops(
        self,
        request: layout.BatchRequest,
        ops: Sequence[layout.OpDesc],
        tensors: Sequence[Tensor],
        profile: memoryview,
    ) -> int:
        matrix = any(desc.opcode in MATRIX_OPS for desc in ops)
        with self.endpoint.computing(matrix=matrix):
            return self._run_each(request, ops, tensors, profile)

    def _run_each(
        self,
        request: layout.BatchRequest,
        ops: Sequence[layout.OpDesc],
        tensors: Sequence[Tensor],
        profile: memoryview,
    ) -> int:
        status: int = Status.OK
        for index, desc in enumerate(ops):
            started = time.monotonic()
            result = self._run_op(request, index, desc, tensors, status)
            if result != Status.OK and status == Status.OK:
                status = result
            if self.profiler:
                usecs = min(int((time.monotonic() - started) * 1e6), 0xFFFFFFFF)
                layout.PROF_DESC.pack_into(
                    profile, index * layout.PROF_DESC.size, desc.opcode, usecs, 0, 0, *[0] * 8
                )
        return status

    def _run_op(
        self,
        request: layout.BatchRequest,
        index: int,
        desc: layout.OpDesc,
        tensors: Sequence[Tensor],
        status: int,
    ) -> int:
        name = layout.op_name(desc.opcode)
        try:
            code = Op(desc.opcode)
        except ValueError:
            code = Op.INVALID
        function = OPS.get(code)
        if function is None:
            log.warning(
                f"htp: op {name} is not implemented by the emulated DSP: NO_SUPPORT",
                extra={"op": name, "seq": request.seq, "index": index},
            )
            return Status.NO_SUPPORT
        try:
            call = OpCall(
                code,
                desc.params,
                [_tensor(tensors, i) for i in desc.src],
                [_tensor(tensors, i) for i in desc.dst],
                status,
            )
            for tensor in (*call.srcs, *call.dsts):
                if tensor is not None:
                    tensor.check_fits()  # before the op allocates a byte
            with np.errstate(all="ignore"):
                function(call)
        except OpError as exc:
            log.warning(
                f"htp: op {name} failed: {exc}",
                extra={"op": name, "seq": request.seq, "index": index, "status": exc.status.name},
            )
            return exc.status
        except MemoryError:
            raise  # past the PD's memory limit: the PD ends, as a DSP process that faults
        except Exception:
            log.error(
                f"htp: op {name} failed inside the emulator",
                extra={
                    "op": name,
                    "seq": request.seq,
                    "index": index,
                    "error": traceback.format_exc(),
                },
            )
            return Status.INTERNAL_ERR
        return Status.OK


def _tensor(tensors: Sequence[Tensor], index: int) -> Tensor | None:
    if index == layout.UNUSED:
        return None
    if index >= len(tensors):
        raise InvalidParamsError(f"tensor index {index} of {len(tensors)}")
    return tensors[index]

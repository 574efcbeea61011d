"""The host side of ggml-hexagon's op batches, in Python, for the emulator's tests
and benches.

What ``ggml-hexagon.cpp`` does around ``htp_iface`` (NOTES section 3 and 6): open the
skel, ``hwinfo``, create and export a dspqueue (:mod:`npud.fastrpc.host.dspqueue_cpu`),
allocate and map the op-queue buffer, ``start``; then, per batch, fill a slot of the
op-queue buffer with ``htp_buf_desc[]``, ``htp_tensor[]`` and ``htp_op_desc[]``, write
one packet (one buffer reference to the slot, flags 0x90, a 24-byte
``htp_opbatch_req``) and read the 88-byte ``htp_opbatch_rsp``.

The structs are written out here from ``htp/htp-ops.h`` (sizes 24, 56, 232, 24, 88),
apart from the emulator's :mod:`npud.sim.htp.layout`.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from npud.fastrpc.host.dspqueue_cpu import Buffer, CpuQueue, CpuQueues
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession

URI: Final = (
    "file:///libggml-htp-v73.so?htp_iface_skel_handle_invoke&_modver=1.0&_dom=cdsp&_session=0"
)
SC_START: Final = 0x02010000
SC_STOP: Final = 0x03000000
SC_MMAP: Final = 0x04010000
SC_MUNMAP: Final = 0x05010000
SC_PROFILER: Final = 0x06010000
SC_ETM: Final = 0x07010000
SC_HWINFO: Final = 0x08000100

STATUS_OK: Final = 1
STATUS_INTERNAL_ERR: Final = 2
STATUS_NO_SUPPORT: Final = 3
STATUS_INVAL_PARAMS: Final = 4

F32, F16, Q4_0, Q4_1, Q8_0, IQ4_NL, I32, I64, MXFP4 = 0, 1, 2, 3, 8, 20, 26, 27, 39
WEIGHT, REPACK = 1, 2
ELEMENT_SIZE: Final = {F32: 4, F16: 2, I32: 4, I64: 8}
BLOCK_SIZE: Final = {Q4_0: 18, Q4_1: 20, Q8_0: 34, IQ4_NL: 18, MXFP4: 17}
TILE_SIZE: Final = {Q4_0: 576, Q4_1: 640, Q8_0: 1088, IQ4_NL: 576, MXFP4: 544}
NUMPY: Final = {F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64}

# Op codes (enum htp_op_code).
OP: Final = {
    name: code
    for code, name in enumerate(
        [
            "MUL",
            "ADD",
            "SUB",
            "DIV",
            "MUL_MAT",
            "MUL_MAT_ID",
            "MUL_MAT_NX",
            "MUL_MAT_ID_NX",
            "MUL_MAT_ADD",
            "RMS_NORM",
            "RMS_NORM_MUL",
            "UNARY_SILU",
            "UNARY_GELU",
            "UNARY_SIGMOID",
            "UNARY_EXP",
            "UNARY_NEG",
            "UNARY_SOFTPLUS",
            "UNARY_TANH",
            "UNARY_ABS",
            "UNARY_LOG",
            "UNARY_RELU",
            "UNARY_STEP",
            "GLU_SWIGLU",
            "GLU_SWIGLU_OAI",
            "GLU_GEGLU",
            "GLU_GEGLU_QUICK",
            "SOFTMAX",
            "ADD_ID",
            "ROPE",
            "FLASH_ATTN_EXT",
            "SET_ROWS",
            "GET_ROWS",
            "SCALE",
            "CPY",
            "CPY_FENCE",
            "ARGSORT",
            "TOP_K",
            "SQR",
            "SQRT",
            "SUM",
            "SUM_ROWS",
            "SSM_CONV",
            "REPEAT",
            "CUMSUM",
            "FILL",
            "DIAG",
            "SOLVE_TRI",
            "L2_NORM",
            "GATED_DELTA_NET",
            "TRI",
            "PAD",
            "NORM",
            "CONCAT",
            "CLAMP",
            "LEAKY_RELU",
            "IM2COL",
            "FENCE",
            "ALLREDUCE",
            "ALLREDUCE_ADD",
            "GLU_SWIGLU_CLAMP",
            "MDEV_GROUP",
            "ROLL",
            "ARGMAX",
            "UNARY_GELU_ERF",
            "GLU_GEGLU_ERF",
            "INVALID",
        ]
    )
}

_REQ: Final = struct.Struct("<QIIII")
_RSP: Final = struct.Struct("<QQQIIIII11I")
_BUF: Final = struct.Struct("<QQII")
_TENSOR: Final = struct.Struct("<QIIIHH4I4I")
_OP: Final = struct.Struct("<II16i32i10H4H2H")
_PROF: Final = struct.Struct("<IIII8I")
_START: Final = struct.Struct("<I4xQIIQ")
_HWINFO: Final = struct.Struct("<III4xQ")
SLOTS: Final = 32


def f32_bits(value: float) -> int:
    """A float as the int32 ggml keeps in op_params."""
    return int(struct.unpack("<i", struct.pack("<f", value))[0])


@dataclasses.dataclass(frozen=True)
class T:
    """An htp_tensor: a buffer, a byte offset and ggml's type, ne and nb."""

    buffer: DmaBuffer
    offset: int
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    flags: int = 0

    @property
    def size(self) -> int:
        last = max((n - 1) * b for n, b in zip(self.ne, self.nb, strict=True))
        return last + self.nb[0]

    def array(self) -> npt.NDArray[np.generic]:
        """The host's view of the elements, shape (ne3, ne2, ne1, ne0)."""
        ne, nb = self.ne, self.nb
        return np.ndarray(
            (ne[3], ne[2], ne[1], ne[0]),
            NUMPY[self.type],
            buffer=self.buffer.view(),
            offset=self.offset,
            strides=(nb[3], nb[2], nb[1], nb[0]),
        )

    def set(self, values: npt.ArrayLike) -> None:
        view = self.array()
        view[...] = np.asarray(values).astype(view.dtype)

    def get(self) -> npt.NDArray[np.float32]:
        return np.array(self.array(), dtype=np.float32)

    def view(self, offset: int, kind: int, ne: Sequence[int], nb: Sequence[int]) -> T:
        """Another tensor over the same buffer (ggml's views)."""
        return T(self.buffer, self.offset + offset, kind, _four(ne), _four(nb), self.flags)


def _four(values: Sequence[int]) -> tuple[int, int, int, int]:
    padded = [*values, *([1] * (4 - len(values)))]
    return (padded[0], padded[1], padded[2], padded[3])


def contiguous_nb(kind: int, ne: Sequence[int]) -> tuple[int, int, int, int]:
    ne4 = _four(ne)
    if kind in BLOCK_SIZE:
        nb0 = BLOCK_SIZE[kind]
        nb1 = ne4[0] // 32 * nb0
    else:
        nb0 = ELEMENT_SIZE[kind]
        nb1 = nb0 * ne4[0]
    return (nb0, nb1, nb1 * ne4[1], nb1 * ne4[1] * ne4[2])


@dataclasses.dataclass(frozen=True)
class OpSpec:
    op: str
    srcs: Sequence[T | None]
    dsts: Sequence[T]
    params: Sequence[int] = ()


@dataclasses.dataclass(frozen=True)
class Response:
    seq: int
    status: int
    n_bufs: int
    n_tensors: int
    n_ops: int
    usecs: int
    buffer: Buffer


class Arena:
    """A buffer the tests carve tensors out of (bump allocation, 128-byte aligned)."""

    def __init__(self, host: HtpHost, size: int) -> None:
        self.buffer = host.queues.map(host.session.alloc(size + 4096))
        self.used = 0

    def tensor(self, kind: int, ne: Sequence[int], flags: int = 0) -> T:
        nb = contiguous_nb(kind, ne)
        size = nb[3] * _four(ne)[3]
        return self.raw(size, kind, ne, nb, flags)

    def raw(self, size: int, kind: int, ne: Sequence[int], nb: Sequence[int], flags: int = 0) -> T:
        offset = self.used
        self.used = (offset + size + 127) // 128 * 128
        assert self.used <= self.buffer.size - 4096, "arena full"
        return T(self.buffer, offset, kind, _four(ne), _four(nb), flags)

    def put(self, tensor: T, data: bytes) -> None:
        self.buffer.view()[tensor.offset : tensor.offset + len(data)] = data


class HtpHost:
    """An htp session as ggml-hexagon opens it, over a CpuQueues of a FastRpcSession."""

    def __init__(self, session: FastRpcSession, queues: CpuQueues, slot_size: int = 1 << 18):
        self.session = session
        self.queues = queues
        self.handle = session.remote_open(URI)
        self.queue: CpuQueue = queues.create(2560, 6656)
        self.slot_size = slot_size
        self.opqueue = queues.map(session.alloc(SLOTS * slot_size + 4096))
        self.seq = 0
        self.responses = 0
        self.started = False

    def invoke(self, sc: int, prim: bytes | None = None, out: int = 0) -> tuple[int, bytes]:
        inputs = [Inline(prim)] if prim is not None else []
        outputs = [Capacity(out)] if out else []
        result = self.session.invoke(self.handle, sc, inputs, outputs)
        return result.rc, (result.outputs[0] or b"") if out else b""

    def hwinfo(self) -> tuple[int, int, int, int]:
        rc, data = self.invoke(SC_HWINFO, out=_HWINFO.size)
        assert rc == 0
        threads, hvx, hmx, vtcm = _HWINFO.unpack(data)
        return int(threads), int(hvx), int(hmx), int(vtcm)

    def start(self, queue_id: int | None = None) -> int:
        qid = self.queue.qid if queue_id is None else queue_id
        rc = self.invoke(SC_START, _START.pack(0, qid, 4, 1, 3000 << 20))[0]
        self.started = self.started or rc == 0
        return rc

    def stop(self) -> int:
        rc = self.invoke(SC_STOP)[0]
        if rc == 0:
            self.started = False
        return rc

    def munmap(self, fd: int) -> int:
        return self.invoke(SC_MUNMAP, struct.pack("<I", fd))[0]

    def close(self) -> None:
        """ggml-hexagon's release: stop, close the queue and the handle."""
        if self.started:
            assert self.stop() == 0
        self.queue.close()
        self.session.remote_close(self.handle)

    # -- batches ---------------------------------------------------------------------------

    def submit(self, ops: Sequence[OpSpec], *, raw_fds: Sequence[int] = ()) -> int:
        """Write one batch; returns its seq. ``raw_fds`` replaces buffer fds in order (to
        name buffers the DSP does not know)."""
        buffers: list[DmaBuffer] = []
        tensors: list[T] = []
        index: dict[tuple[int, int, int, tuple[int, ...], tuple[int, ...]], int] = {}

        def tensor_index(tensor: T | None) -> int:
            if tensor is None:
                return 0xFFFF
            key = (tensor.buffer.fd, tensor.offset, tensor.type, tensor.ne, tensor.nb)
            if key not in index:
                index[key] = len(tensors)
                tensors.append(tensor)
                if all(b is not tensor.buffer for b in buffers):
                    buffers.append(tensor.buffer)
            return index[key]

        op_bytes = b""
        for spec in ops:
            srcs = [tensor_index(t) for t in spec.srcs]
            dsts = [tensor_index(t) for t in spec.dsts]
            params = [*spec.params, *([0] * (16 - len(spec.params)))]
            op_bytes += _OP.pack(
                OP[spec.op],
                0,
                *params,
                *([0] * 32),
                *[*srcs, *([0xFFFF] * (10 - len(srcs)))],
                *[*dsts, *([0xFFFF] * (4 - len(dsts)))],
                0,
                0,
            )
        fds = [b.fd for b in buffers]
        fds[: len(raw_fds)] = raw_fds
        buf_bytes = b"".join(
            _BUF.pack(b.host_address, b.size, 0, fd) for b, fd in zip(buffers, fds, strict=True)
        )
        tensor_bytes = b""
        for number, t in enumerate(tensors):
            bi = next(i for i, b in enumerate(buffers) if b is t.buffer)
            tensor_bytes += _TENSOR.pack(
                t.offset, t.size, t.flags, t.type, bi, number, *t.ne, *t.nb
            )
        self.seq += 1
        slot = (self.seq - 1) % SLOTS
        offset = slot * self.slot_size
        block = buf_bytes + tensor_bytes + op_bytes
        size = len(block) + _PROF.size * len(ops)
        assert size <= self.slot_size
        view = self.opqueue.view()
        view[offset : offset + size] = block + bytes(_PROF.size * len(ops))
        request = _REQ.pack(self.seq, len(buffers), len(tensors), len(ops), 0)
        reference = Buffer(self.opqueue.fd, size, offset, 0x90, self.opqueue.host_address + offset)
        self.queue.write([reference], request)
        return self.seq

    def collect(self) -> Response:
        packet = self.queue.read()
        assert len(packet.message) == _RSP.size
        assert len(packet.buffers) == 1
        fields = _RSP.unpack(packet.message)
        self.responses += 1
        return Response(
            fields[0], fields[3], fields[4], fields[5], fields[6], fields[7], packet.buffers[0]
        )

    def run(self, ops: Sequence[OpSpec]) -> int:
        seq = self.submit(ops)
        response = self.collect()
        assert response.seq == seq
        assert response.n_ops == len(ops)
        return response.status

    def profile(self, response: Response) -> list[tuple[int, int]]:
        """(opcode, usecs) of each op of an answered batch."""
        data = self.opqueue.view()
        start = response.buffer.offset + 24 * response.n_bufs + 56 * response.n_tensors
        start += 232 * response.n_ops
        return [
            (int(fields[0]), int(fields[1]))
            for fields in (_PROF.unpack_from(data, start + 48 * i) for i in range(response.n_ops))
        ]

"""The wire of ggml's Hexagon backend (llama.cpp ``ggml/src/ggml-hexagon/htp/htp-ops.h``):
op codes, statuses, types and the structs of an op batch, as the host lays them out
(LP64, little-endian; sizes checked against the host's compiled structs).

One batch is one packet of the session's dspqueue: the message is an
``htp_opbatch_req`` and its one buffer reference points at a slot of the op-queue
buffer holding ``htp_buf_desc[n_bufs]``, ``htp_tensor[n_tensors]``,
``htp_op_desc[n_ops]`` and room for ``htp_prof_desc[n_ops]`` (plus trace events).
The answer is an ``htp_opbatch_rsp`` with the same buffer reference.
"""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple

# -- statuses (success is 1) -------------------------------------------------------------


class Status(enum.IntEnum):
    OK = 1
    INTERNAL_ERR = 2
    NO_SUPPORT = 3
    INVAL_PARAMS = 4
    VTCM_TOO_SMALL = 5


# -- op codes (enum htp_op_code, in order) ----------------------------------------------------


class Op(enum.IntEnum):
    """enum htp_op_code."""

    MUL = 0
    ADD = 1
    SUB = 2
    DIV = 3
    MUL_MAT = 4
    MUL_MAT_ID = 5
    MUL_MAT_NX = 6
    MUL_MAT_ID_NX = 7
    MUL_MAT_ADD = 8
    RMS_NORM = 9
    RMS_NORM_MUL = 10
    UNARY_SILU = 11
    UNARY_GELU = 12
    UNARY_SIGMOID = 13
    UNARY_EXP = 14
    UNARY_NEG = 15
    UNARY_SOFTPLUS = 16
    UNARY_TANH = 17
    UNARY_ABS = 18
    UNARY_LOG = 19
    UNARY_RELU = 20
    UNARY_STEP = 21
    GLU_SWIGLU = 22
    GLU_SWIGLU_OAI = 23
    GLU_GEGLU = 24
    GLU_GEGLU_QUICK = 25
    SOFTMAX = 26
    ADD_ID = 27
    ROPE = 28
    FLASH_ATTN_EXT = 29
    SET_ROWS = 30
    GET_ROWS = 31
    SCALE = 32
    CPY = 33
    CPY_FENCE = 34
    ARGSORT = 35
    TOP_K = 36
    SQR = 37
    SQRT = 38
    SUM = 39
    SUM_ROWS = 40
    SSM_CONV = 41
    REPEAT = 42
    CUMSUM = 43
    FILL = 44
    DIAG = 45
    SOLVE_TRI = 46
    L2_NORM = 47
    GATED_DELTA_NET = 48
    TRI = 49
    PAD = 50
    NORM = 51
    CONCAT = 52
    CLAMP = 53
    LEAKY_RELU = 54
    IM2COL = 55
    FENCE = 56
    ALLREDUCE = 57
    ALLREDUCE_ADD = 58
    GLU_SWIGLU_CLAMP = 59
    MDEV_GROUP = 60
    ROLL = 61
    ARGMAX = 62
    UNARY_GELU_ERF = 63
    GLU_GEGLU_ERF = 64
    INVALID = 65


OP_NAMES: Final = tuple(op.name for op in Op)


def op_name(code: int) -> str:
    return OP_NAMES[code] if 0 <= code < len(OP_NAMES) else f"op {code}"


# -- tensor types (the ggml types the host sends) ---------------------------------------------


class Type(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    I32 = 26
    I64 = 27
    MXFP4 = 39


# -- flags -----------------------------------------------------------------------------------

TENSOR_WEIGHT: Final = 1
TENSOR_REPACK: Final = 2
TENSOR_FENCE: Final = 4
BUF_EXTENDED: Final = 1
UNUSED: Final = 0xFFFF
"""A src / dst slot of an op that names no tensor."""

MAX_INPUTS: Final = 10
MAX_OUTPUTS: Final = 4
MAX_PARAMS: Final = 16
MAX_KERNEL_PARAMS: Final = 32
MAX_BUFS: Final = 16
MAX_TENSORS: Final = 8192
MAX_THREADS: Final = 10
"""HTP_MAX_NTHREADS: the response has n_traces[MAX_THREADS + 1]."""

# -- structs -----------------------------------------------------------------------------------

REQ: Final = struct.Struct("<QIIII")  # seq, n_bufs, n_tensors, n_ops, n_traces
RSP: Final = struct.Struct("<QQQIIIII11I")  # seq, cycles start/stop, status, counts, usecs, traces
BUF_DESC: Final = struct.Struct("<QQII")  # base, size, flags, fd
TENSOR: Final = struct.Struct("<QIIIHH4I4I")  # data, size, flags, type, bi, ti, ne[4], nb[4]
OP_DESC: Final = struct.Struct("<II16i32i10H4H2H")  # opcode, flags, params, kernel, src, dst, pad
PROF_DESC: Final = struct.Struct("<IIII8I")  # opcode, usecs, cycles start/stop, pmu[8]
TRACE_DESC_SIZE: Final = 8

assert REQ.size == 24 and RSP.size == 88 and BUF_DESC.size == 24  # noqa: PT018
assert TENSOR.size == 56 and OP_DESC.size == 232 and PROF_DESC.size == 48  # noqa: PT018


class BatchRequest(NamedTuple):
    seq: int
    n_bufs: int
    n_tensors: int
    n_ops: int
    n_traces: int


class BufDesc(NamedTuple):
    base: int
    size: int
    flags: int
    fd: int


class TensorDesc(NamedTuple):
    data: int
    size: int
    flags: int
    type: int
    bi: int
    ti: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]


class OpDesc(NamedTuple):
    opcode: int
    flags: int
    params: tuple[int, ...]
    src: tuple[int, ...]
    dst: tuple[int, ...]


def unpack_tensor(data: bytes | memoryview, offset: int) -> TensorDesc:
    data_offset, size, flags, kind, bi, ti, *dims = TENSOR.unpack_from(data, offset)
    ne = (dims[0], dims[1], dims[2], dims[3])
    nb = (dims[4], dims[5], dims[6], dims[7])
    return TensorDesc(data_offset, size, flags, kind, bi, ti, ne, nb)


def unpack_op(data: bytes | memoryview, offset: int) -> OpDesc:
    fields = OP_DESC.unpack_from(data, offset)
    params = fields[2:18]
    src = fields[50:60]
    dst = fields[60:64]
    return OpDesc(fields[0], fields[1], params, src, dst)


def pack_response(
    seq: int, status: int, n_bufs: int, n_tensors: int, n_ops: int, usecs: int
) -> bytes:
    return RSP.pack(seq, 0, 0, status, n_bufs, n_tensors, n_ops, usecs, *([0] * 11))


def batch_bytes(request: BatchRequest) -> int:
    """What the batch's buffer reference must cover (as the DSP checks it)."""
    return (
        BUF_DESC.size * request.n_bufs
        + TENSOR.size * request.n_tensors
        + OP_DESC.size * request.n_ops
        + PROF_DESC.size * request.n_ops
        + (MAX_THREADS + 1) * request.n_traces * TRACE_DESC_SIZE
    )

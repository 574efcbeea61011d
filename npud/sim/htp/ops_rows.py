"""Ops that move, gather, reduce or order elements, as ggml-cpu does (``ops.cpp``).

* GET_ROWS: ``dst[i12, i11, i10] = src0[i12, i11, ids[i12, i11, i10]]`` (rows of f32,
  f16, i32, plain or repacked q4_0 / q8_0 ...; a quantized row comes out f32).
* SET_ROWS: ``dst[i03, i02, ids[i03 % ne12, i02 % ne11, i]] = src0[i03, i02, i]``,
  f32 rows into an f32, f16 or q8_0 destination (a KV cache).
* CPY (ggml's CPY and CONT): the elements in ggml order into the destination's shape,
  converted (f32, f16, i32; float to int truncates).
* REPEAT, CONCAT (op_params[0]: the ggml dimension), PAD (left/right per dimension,
  op_params[8]: circular), ROLL (shift per dimension), FILL (op_params[0]), DIAG.
* CUMSUM, SUM, SUM_ROWS (double sums), ARGMAX (first maximum), ARGSORT (op_params[0]:
  0 ascending, 1 descending), TOP_K (the k largest, descending, the first two
  swapped as ggml-cpu does to say their order does not matter).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp import quant
from npud.sim.htp.layout import Op, Type
from npud.sim.htp.opcall import OpCall, OpFunction, repeat_to, same_shape
from npud.sim.htp.tensors import (
    NATIVE,
    Array,
    InvalidParamsError,
    NotSupportedError,
    Tensor,
    check_scratch,
)

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


def gather_rows(src: Tensor, i3: I64, i2: I64, rows: I64) -> Array:
    """Rows of ``src`` at the broadcast indexes, shape (..., ne0): elements as stored for
    f32/f16/i32/i64, float32 for quantized rows (only the rows asked for are decoded)."""
    kind = src.type
    if src.repacked:
        tile = quant.TILE_BYTES.get(Type(kind)) if kind in quant.TILE_BYTES else None
        if tile is None:
            raise NotSupportedError(f"rows of {src.describe()}")
        picked_rows = np.broadcast_shapes(i3.shape, i2.shape, rows.shape)
        check_scratch(int(np.prod(picked_rows)) * quant.QK * src.ne[0], "GET_ROWS")
        tiles = src.tiles()
        per_ct = (src.ne[0] // quant.QK) * tile
        by_ct = tiles.reshape(*tiles.shape[:2], src.ne[1] // quant.QK, per_ct)
        picked = by_ct[i3, i2, rows // quant.QK]
        decoded = quant.decode_tiles(picked, Type(kind), src.ne[0], quant.QK)  # (..., 32, ne0)
        which = np.broadcast_to(rows % quant.QK, decoded.shape[:-2])[..., None, None]
        return np.take_along_axis(decoded, which, axis=-2)[..., 0, :]
    if kind in NATIVE:
        return src.array()[i3, i2, rows]
    return quant.dequantize(src.rows()[i3, i2, rows], Type(kind))


def get_rows(op: OpCall) -> None:
    src, ids_t, dst = op.src(0), op.src(1), op.dst()
    ids = ids_t.indices()[0]  # (ne12, ne11, ne10)
    n12, n11, _ = ids.shape
    if dst.shape[:3] != ids.shape or dst.ne[0] > src.ne[0]:
        raise InvalidParamsError(f"GET_ROWS: {dst.describe()} does not fit the ids")
    if src.shape[0] != n12 or src.shape[1] != n11:
        raise InvalidParamsError("GET_ROWS: ids and rows differ in their outer dimensions")
    rows_real = src.ne[1]
    if ids.size and (ids.min() < 0 or ids.max() >= rows_real):
        raise InvalidParamsError("GET_ROWS: an id outside the rows")
    i3 = np.arange(n12)[:, None, None]
    i2 = np.arange(n11)[None, :, None]
    values = gather_rows(src, i3, i2, ids)
    dst.store(values[..., : dst.ne[0]])


def set_rows(op: OpCall) -> None:
    src, ids_t, dst = op.src(0), op.src(1), op.dst()
    ne03, ne02, ne01, ne00 = src.shape
    ids = ids_t.indices()[0]  # (ne12, ne11, ne10)
    if dst.ne[0] != ne00 or dst.shape[:2] != (ne03, ne02) or ids.shape[2] != ne01:
        raise InvalidParamsError(f"SET_ROWS: {src.describe()} does not fit {dst.describe()}")
    if ne03 % ids.shape[0] or ne02 % ids.shape[1]:
        raise InvalidParamsError("SET_ROWS: ids do not repeat over the rows")
    full = ids[np.arange(ne03)[:, None] % ids.shape[0], np.arange(ne02)[None, :] % ids.shape[1]]
    if full.size and (full.min() < 0 or full.max() >= dst.ne[1]):
        raise InvalidParamsError("SET_ROWS: an id outside the destination's rows")
    i3 = np.arange(ne03)[:, None, None]
    i2 = np.arange(ne02)[None, :, None]
    values = src.load()
    if dst.type == Type.Q8_0 and not dst.repacked:
        dst.rows()[i3, i2, full] = quant.quantize_q8_0(np.ascontiguousarray(values))
    elif dst.type in (Type.F32, Type.F16):
        view = dst.array()
        view[i3, i2, full] = values.astype(view.dtype)
    else:
        raise NotSupportedError(f"SET_ROWS into {dst.describe()}")


def _elements(tensor: Tensor) -> Array:
    """The elements as stored (f32, f16, i32, i64), or float32 for quantized ones."""
    if tensor.type in NATIVE and not tensor.repacked:
        return tensor.array()
    return tensor.load()


def cpy(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    if src.nelements != dst.nelements:
        raise InvalidParamsError(f"CPY: {src.describe()} into {dst.describe()}")
    values = _elements(src)
    if src.type != dst.type and values.dtype.kind == "f" and dst.type in (Type.F32, Type.F16):
        values = values.astype(np.float32)
    dst.store(np.reshape(values, dst.shape))


def repeat(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    dst.store(repeat_to(_elements(src), dst.shape))


def concat(op: OpCall) -> None:
    a, b, dst = op.src(0), op.src(1), op.dst()
    dim = op.i32(0)
    if not 0 <= dim < 4:
        raise InvalidParamsError(f"CONCAT: dimension {dim}")
    joined = np.concatenate([_elements(a), _elements(b)], axis=3 - dim)
    if joined.shape != dst.shape:
        raise InvalidParamsError(f"CONCAT: {dst.describe()} does not fit")
    dst.store(joined)


def pad(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    left = [op.i32(2 * i) for i in range(4)]  # ggml dims 0..3
    circular = op.i32(8)
    values = src.load()
    if circular:
        grid = np.ix_(*[(np.arange(dst.ne[d]) - left[d]) % src.ne[d] for d in (3, 2, 1, 0)])
        dst.store(values[grid])
        return
    right = [op.i32(2 * i + 1) for i in range(4)]
    if any(src.ne[d] + left[d] + right[d] != dst.ne[d] for d in range(4)):
        raise InvalidParamsError(f"PAD: {src.describe()} padded is not {dst.describe()}")
    out = np.zeros(dst.shape, np.float32)
    out[
        left[3] : left[3] + src.ne[3],
        left[2] : left[2] + src.ne[2],
        left[1] : left[1] + src.ne[1],
        left[0] : left[0] + src.ne[0],
    ] = values
    dst.store(out)


def roll(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "ROLL")
    shifts = (op.i32(3), op.i32(2), op.i32(1), op.i32(0))
    dst.store(np.roll(src.load(), shifts, axis=(0, 1, 2, 3)))


def fill(op: OpCall) -> None:
    op.dst().store(op.f32_np(0))


def diag(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    n = src.ne[0]
    if src.ne[1] != 1 or dst.ne[0] != n or dst.ne[1] != n:
        raise InvalidParamsError(f"DIAG: {src.describe()} into {dst.describe()}")
    values = src.load()[:, :, 0, :]  # (ne3, ne2, n)
    dst.store(values[:, :, None, :] * np.eye(n, dtype=np.float32))


def cumsum(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "CUMSUM")
    dst.store(np.cumsum(src.load(), axis=-1, dtype=np.float32))


def sum_all(op: OpCall) -> None:
    op.dst().store(np.float32(op.src(0).load().astype(np.float64).sum()))


def sum_rows(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    if dst.shape != (*src.shape[:3], 1):
        raise InvalidParamsError(f"SUM_ROWS: {dst.describe()}")
    dst.store(src.load().astype(np.float64).sum(axis=-1, keepdims=True).astype(np.float32))


def argmax(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    if dst.nelements != src.nrows:
        raise InvalidParamsError(f"ARGMAX: {dst.describe()}")
    best = np.argmax(src.load(), axis=-1).astype(np.int32)
    dst.store(best.reshape(dst.shape))


def argsort(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "ARGSORT")
    order = op.i32(0)
    values = src.load()
    if order == 0:
        index = np.argsort(values, axis=-1, kind="stable")
    elif order == 1:
        index = np.argsort(-values, axis=-1, kind="stable")
    else:
        raise InvalidParamsError(f"ARGSORT: order {order}")
    dst.store(index.astype(np.int32))


def top_k(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    k = dst.ne[0]
    if dst.shape[:3] != src.shape[:3] or k > src.ne[0]:
        raise InvalidParamsError(f"TOP_K: {dst.describe()} from {src.describe()}")
    index = np.argsort(-src.load(), axis=-1, kind="stable")[..., :k].astype(np.int32)
    if k > 1:
        index[..., [0, 1]] = index[..., [1, 0]]
    dst.store(index)


FUNCTIONS: Final[dict[Op, OpFunction]] = {
    Op.GET_ROWS: get_rows,
    Op.SET_ROWS: set_rows,
    Op.CPY: cpy,
    Op.REPEAT: repeat,
    Op.CONCAT: concat,
    Op.PAD: pad,
    Op.ROLL: roll,
    Op.FILL: fill,
    Op.DIAG: diag,
    Op.CUMSUM: cumsum,
    Op.SUM: sum_all,
    Op.SUM_ROWS: sum_rows,
    Op.ARGMAX: argmax,
    Op.ARGSORT: argsort,
    Op.TOP_K: top_k,
}

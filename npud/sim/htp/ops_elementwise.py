"""Element-wise ops, as ggml-cpu computes them (``ggml-cpu/binary-ops.cpp``,
``unary-ops.cpp``, ``vec.h``, ``ops.cpp``): in float32, f16 tensors converted on the
way in and rounded on the way out.

* MUL, ADD, SUB, DIV: ``dst = src0 op src1``, src1 repeated to src0's shape.
* ADD_ID: ``dst[i2, i1] = src0[i2, i1] + src1[ids[i2, i1]]`` (rows of src1).
* UNARY_*: SILU, GELU (op_params[0] tells GELU from GELU_QUICK, both sent as
  UNARY_GELU; ggml-cpu evaluates both through f16 tables), GELU_ERF, SIGMOID, EXP,
  NEG, SOFTPLUS, TANH, ABS, LOG, RELU, STEP; SQR, SQRT; SCALE (``x s + b``), CLAMP,
  LEAKY_RELU, TRI.
* GLU_*: SWIGLU, GEGLU, GEGLU_QUICK, GEGLU_ERF, SWIGLU_OAI, SWIGLU_CLAMP on two
  tensors, or on the two halves of one (op_params[1]: swapped).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op, Type
from npud.sim.htp.opcall import OpCall, OpFunction, as_f32, f16_round, repeat_to, same_shape
from npud.sim.htp.tensors import InvalidParamsError, NotSupportedError

F32 = npt.NDArray[np.float32]

GELU_COEF_A: Final = np.float32(0.044715)
GELU_QUICK_COEF: Final = np.float32(-1.702)
SQRT_2_OVER_PI: Final = np.float32(0.79788456080286535587989211986876)
SQRT_2_INV: Final = np.float32(0.70710678118654752440084436210484)
GGML_UNARY_OP_GELU: Final = 8
GGML_UNARY_OP_GELU_QUICK: Final = 9
ONE: Final = np.float32(1)
HALF: Final = np.float32(0.5)

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(values: F32) -> F32:
    """erff, through double precision (numpy has no erf)."""
    return np.asarray(_erf(values.astype(np.float64)), np.float64).astype(np.float32)


# -- scalar functions of ggml-cpu -----------------------------------------------------------


def silu(x: F32) -> F32:
    return as_f32(x / (ONE + np.exp(-x)))


def sigmoid(x: F32) -> F32:
    return as_f32(ONE / (ONE + np.exp(-x)))


def gelu_exact(x: F32) -> F32:
    """ggml_gelu_f32 (the tanh approximation)."""
    return as_f32(HALF * x * (ONE + np.tanh(SQRT_2_OVER_PI * x * (ONE + GELU_COEF_A * x * x))))


def gelu(x: F32) -> F32:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 below -10, x above 10, the f16 table
    (gelu of the f16 value, rounded to f16) between."""
    table = f16_round(gelu_exact(f16_round(x)))
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, table)).astype(np.float32)


def gelu_quick(x: F32) -> F32:
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: the f16 table."""
    x16 = f16_round(x)
    return f16_round(x16 * (ONE / (ONE + np.exp(GELU_QUICK_COEF * x16))))


def gelu_erf(x: F32) -> F32:
    return HALF * x * (ONE + erf(x * SQRT_2_INV))


def softplus(x: F32) -> F32:
    return np.where(x > 20, x, np.log(ONE + np.exp(x))).astype(np.float32)


# -- binary ----------------------------------------------------------------------------------

_BINARY: Final[dict[Op, Callable[[F32, F32], F32]]] = {
    Op.MUL: np.multiply,
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.DIV: np.divide,
}


def binary(op: OpCall) -> None:
    a, b, dst = op.src(0), op.src(1), op.dst()
    same_shape(a, dst, op.code.name)
    function = _BINARY[op.code]
    dst.store(function(a.load(), repeat_to(b.load(), a.shape)))


def add_id(op: OpCall) -> None:
    a, rows, ids, dst = op.src(0), op.src(1), op.src(2), op.dst()
    same_shape(a, dst, "ADD_ID")
    index = ids.indices()[0, 0]  # (ne2, ne1) of src0
    table = rows.load()[0, 0]  # (rows, ne0)
    if index.shape != a.shape[1:3] or table.shape[-1] != a.ne[0]:
        raise InvalidParamsError("ADD_ID: ids or rows do not fit src0")
    if index.size and (index.min() < 0 or index.max() >= table.shape[0]):
        raise InvalidParamsError("ADD_ID: an id outside the rows of src1")
    dst.store(a.load() + table[index][None])


# -- unary -----------------------------------------------------------------------------------


def _leaky_relu(op: OpCall, x: F32) -> F32:
    slope = op.f32_np(0)
    return (np.where(x > 0, x, 0) + slope * np.where(x < 0, x, 0)).astype(np.float32)


def _tri(op: OpCall, x: F32) -> F32:
    kind = op.i32(0)
    col = np.arange(x.shape[-1])[None, :]
    row = np.arange(x.shape[-2])[:, None]
    predicates = {3: col < row, 2: col <= row, 1: col > row, 0: col >= row}
    keep = predicates.get(kind)
    if keep is None:
        raise InvalidParamsError(f"TRI: type {kind}")
    return np.where(keep, x, np.float32(0)).astype(np.float32)


def _scale(op: OpCall, x: F32) -> F32:
    s, b = op.f32_np(0), op.f32_np(1)
    return x * s if b == 0 else x * s + b


def _clamp(op: OpCall, x: F32) -> F32:
    low, high = op.f32_np(0), op.f32_np(1)
    return np.maximum(np.minimum(x, high), low)


def _gelu_variant(op: OpCall, x: F32) -> F32:
    kind = op.i32(0)
    if kind == GGML_UNARY_OP_GELU_QUICK:
        return gelu_quick(x)
    if kind == GGML_UNARY_OP_GELU:
        return gelu(x)
    raise InvalidParamsError(f"UNARY_GELU with unary op {kind}")


def _simple(function: Callable[[F32], F32]) -> Callable[[OpCall, F32], F32]:
    def apply(op: OpCall, x: F32) -> F32:
        return function(x)

    return apply


_UNARY: Final[dict[Op, Callable[[OpCall, F32], F32]]] = {
    Op.UNARY_SILU: _simple(silu),
    Op.UNARY_GELU: _gelu_variant,
    Op.UNARY_GELU_ERF: _simple(gelu_erf),
    Op.UNARY_SIGMOID: _simple(sigmoid),
    Op.UNARY_EXP: _simple(np.exp),
    Op.UNARY_NEG: _simple(np.negative),
    Op.UNARY_SOFTPLUS: _simple(softplus),
    Op.UNARY_TANH: _simple(np.tanh),
    Op.UNARY_ABS: _simple(np.abs),
    Op.UNARY_LOG: _simple(np.log),
    Op.UNARY_RELU: _simple(lambda x: np.where(x > 0, x, np.float32(0)).astype(np.float32)),
    Op.UNARY_STEP: _simple(lambda x: np.where(x > 0, ONE, np.float32(0)).astype(np.float32)),
    Op.SQR: _simple(lambda x: x * x),
    Op.SQRT: _simple(np.sqrt),
    Op.SCALE: _scale,
    Op.CLAMP: _clamp,
    Op.LEAKY_RELU: _leaky_relu,
    Op.TRI: _tri,
}


def unary(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, op.code.name)
    if src.type not in (Type.F32, Type.F16):
        raise NotSupportedError(f"{op.code.name} on {src.describe()}")
    dst.store(_UNARY[op.code](op, src.load()))


# -- gated linear units ----------------------------------------------------------------------


def _swiglu_oai(op: OpCall, x: F32, g: F32) -> F32:
    alpha, limit = op.f32_np(2), op.f32_np(3)
    x = np.minimum(x, limit)
    g = np.clip(g, -limit, limit)
    return as_f32((x / (ONE + np.exp(alpha * -x))) * (g + ONE))


def _swiglu_clamp(op: OpCall, x: F32, g: F32) -> F32:
    limit = op.f32_np(3)
    gate = np.minimum(x, limit)
    return as_f32(gate / (ONE + np.exp(-gate)) * np.clip(g, -limit, limit))


def _geglu(op: OpCall, x: F32, g: F32) -> F32:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): 0 below -10, x g above 10, table times g."""
    table = f16_round(gelu_exact(f16_round(x))) * g
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x * g, table)).astype(np.float32)


_GLU: Final[dict[Op, Callable[[OpCall, F32, F32], F32]]] = {
    Op.GLU_SWIGLU: lambda op, x, g: silu(x) * g,
    Op.GLU_GEGLU: _geglu,
    Op.GLU_GEGLU_QUICK: lambda op, x, g: gelu_quick(x) * g,
    Op.GLU_GEGLU_ERF: lambda op, x, g: gelu_erf(x) * g,
    Op.GLU_SWIGLU_OAI: _swiglu_oai,
    Op.GLU_SWIGLU_CLAMP: _swiglu_clamp,
}


def glu(op: OpCall) -> None:
    a, other, dst = op.src(0), op.optional(1), op.dst()
    values = a.load()
    if other is None:
        half = a.ne[0] // 2
        first, second = values[..., :half], values[..., half : 2 * half]
        x, g = (second, first) if op.i32(1) else (first, second)
    else:
        same_shape(a, other, op.code.name)
        x, g = values, other.load()
    if x.shape != dst.shape:
        raise InvalidParamsError(f"{op.code.name}: {dst.describe()} does not fit the halves")
    dst.store(_GLU[op.code](op, x, g))


FUNCTIONS: Final[dict[Op, OpFunction]] = {
    **dict.fromkeys(_BINARY, binary),
    Op.ADD_ID: add_id,
    **dict.fromkeys(_UNARY, unary),
    **dict.fromkeys(_GLU, glu),
}

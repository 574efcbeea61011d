"""Matrix products, as ggml defines them, in float32.

* MUL_MAT: src0 (weights) ``[K, N, ne02, ne03]``, src1 ``[K, M, ne12, ne13]``, dst
  ``[N, M, ne12, ne13]``: ``dst[i3, i2, m, n] = sum_k src0[i3 / r3, i2 / r2, n, k]
  src1[i3, i2, m, k]`` (``r2 = ne12 / ne02``: consecutive src1 slices share a weight
  slice). Weights f32, f16, or quantized: plain blocks, or repacked tiles (their
  ne0/ne1 padded to 32: the rows past dst's ne0 are padding). The DSP quantizes
  activations where ggml-cpu does too, in its own way; both agree with this to
  rounding.
* MUL_MAT_ADD (MUL_MAT and ADD fused by the host): src2 added, repeated as ggml's ADD
  repeats its second operand into the first.
* MUL_MAT_NX (N products sharing src1): srcs ``w0 .. w(N-1), x``, dsts ``d0 .. d(N-1)``.
* MUL_MAT_ID: src0 experts ``[K, N, n_expert]``, src1 ``[K, ne11, T]``, src2 ids
  (i32) ``[n_used, T]``: ``dst[t, e] = src0[ids[t, e]] . src1[t, e % ne11]``;
  MUL_MAT_ID_NX: srcs ``w0 .. w(N-1), x, ids``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op
from npud.sim.htp.opcall import OpCall, OpFunction, as_f32, repeat_to
from npud.sim.htp.tensors import InvalidParamsError, Tensor, check_scratch

F32 = npt.NDArray[np.float32]


def _weights(weight: Tensor, rows: int, k: int) -> F32:
    """The weight as float32 (ne03, ne02, rows, k), its padding cut off."""
    values = weight.load()
    if values.shape[2] < rows or values.shape[3] < k:
        raise InvalidParamsError(f"{weight.describe()}: fewer than {rows} rows of {k}")
    return values[:, :, :rows, :k]


def product(weight: Tensor, x: Tensor, n: int) -> F32:
    """src1 times the first ``n`` rows of src0 transposed, (ne13, ne12, M, n); the
    weight's slices are broadcast over src1's."""
    k = x.ne[0]
    w = _weights(weight, n, k)
    if x.shape[0] % w.shape[0] or x.shape[1] % w.shape[1]:
        raise InvalidParamsError(f"MUL_MAT: {weight.describe()} does not broadcast to src1")
    slices = x.shape[0] * x.shape[1]
    check_scratch(slices * (w.shape[2] * w.shape[3] + x.shape[2] * w.shape[2]), "MUL_MAT")
    w = np.repeat(w, x.shape[1] // w.shape[1], axis=1)
    w = np.repeat(w, x.shape[0] // w.shape[0], axis=0)
    return as_f32(np.matmul(x.load(), np.swapaxes(w, -1, -2)))


def _product_into(weight: Tensor, x: Tensor, dst: Tensor) -> F32:
    result = product(weight, x, dst.ne[0])
    if result.shape != dst.shape:
        raise InvalidParamsError(f"{dst.describe()} does not fit the product of {x.describe()}")
    return result


def mul_mat(op: OpCall) -> None:
    dst = op.dst()
    dst.store(_product_into(op.src(0), op.src(1), dst))


def mul_mat_add(op: OpCall) -> None:
    dst, addend = op.dst(), op.src(2)
    result = product(op.src(0), op.src(1), dst.ne[0])
    other = addend.load()
    if result.shape == dst.shape:  # ADD(product, addend)
        dst.store(result + repeat_to(other, dst.shape))
    elif other.shape == dst.shape:  # ADD(addend, product)
        dst.store(other + repeat_to(result, dst.shape))
    else:
        raise InvalidParamsError(f"MUL_MAT_ADD: {dst.describe()} fits neither operand")


def mul_mat_nx(op: OpCall) -> None:
    count = op.n_dsts
    if count < 1 or op.n_srcs != count + 1:
        raise InvalidParamsError(f"MUL_MAT_NX: {op.n_srcs} sources for {count} products")
    x = op.src(count)
    results = [_product_into(op.src(i), x, op.dst(i)) for i in range(count)]
    for i, result in enumerate(results):
        op.dst(i).store(result)


def expert_product(weight: Tensor, x: Tensor, ids: Tensor, dst: Tensor) -> F32:
    experts = weight.load()[0]  # (n_expert, rows, k), maybe padded
    k, n = x.ne[0], dst.ne[0]
    index = ids.indices()[0, 0]  # (T, n_used)
    tokens, used = index.shape
    if dst.shape != (1, tokens, used, n) or x.shape[1] != tokens or used % x.ne[1]:
        raise InvalidParamsError(f"MUL_MAT_ID: {dst.describe()} does not fit the ids")
    if experts.shape[1] < n or experts.shape[2] < k:
        raise InvalidParamsError(f"MUL_MAT_ID: {weight.describe()} is too small")
    if index.size and (index.min() < 0 or index.max() >= experts.shape[0]):
        raise InvalidParamsError("MUL_MAT_ID: an expert id outside the experts")
    check_scratch(tokens * used * (k + n), "MUL_MAT_ID")
    inputs = x.load()[0][:, np.arange(used) % x.ne[1], :]  # (T, n_used, k)
    out = np.zeros((tokens, used, n), np.float32)
    for expert in np.unique(index):
        chosen = index == expert
        out[chosen] = np.matmul(inputs[chosen], experts[expert, :n, :k].T)
    return out[None]


def mul_mat_id(op: OpCall) -> None:
    dst = op.dst()
    dst.store(expert_product(op.src(0), op.src(1), op.src(2), dst))


def mul_mat_id_nx(op: OpCall) -> None:
    count = op.n_dsts
    if count < 1 or op.n_srcs != count + 2:
        raise InvalidParamsError(f"MUL_MAT_ID_NX: {op.n_srcs} sources for {count} products")
    x, ids = op.src(count), op.src(count + 1)
    results = [expert_product(op.src(i), x, ids, op.dst(i)) for i in range(count)]
    for i, result in enumerate(results):
        op.dst(i).store(result)


FUNCTIONS: Final[dict[Op, OpFunction]] = {
    Op.MUL_MAT: mul_mat,
    Op.MUL_MAT_ADD: mul_mat_add,
    Op.MUL_MAT_NX: mul_mat_nx,
    Op.MUL_MAT_ID: mul_mat_id,
    Op.MUL_MAT_ID_NX: mul_mat_id_nx,
}

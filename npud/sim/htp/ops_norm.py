"""Row normalisations and the softmax, as ggml-cpu computes them (``ops.cpp``): sums in
double precision where ggml accumulates in ``ggml_float``, everything else in float32.

* RMS_NORM: ``x / sqrt(mean(x^2) + eps)``; RMS_NORM_MUL (the host's fusion of
  RMS_NORM and MUL): times src1, repeated to the rows; eps = op_params[0] (float).
* NORM: ``(x - mean) / sqrt(var + eps)``; L2_NORM: ``x / max(|x|, eps)``.
* SOFTMAX: ``softmax(x scale + slope mask)`` per row, with ALiBi slopes per head from
  max_bias (op_params 0, 1), the mask's rows broadcast over heads and sequences, and
  sinks (src2) counted in the denominator.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op
from npud.sim.htp.opcall import OpCall, OpFunction, as_f32, repeat_to, same_shape
from npud.sim.htp.tensors import InvalidParamsError

F32 = npt.NDArray[np.float32]
ONE: Final = np.float32(1)


def rms_scale(x: F32, eps: np.float32) -> F32:
    """1 / sqrtf(mean + eps) per row, the mean of the float squares summed in double."""
    mean = ((x * x).astype(np.float64).sum(axis=-1) / x.shape[-1]).astype(np.float32)
    return as_f32(ONE / np.sqrt(mean + eps))[..., None]


def rms_norm(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "RMS_NORM")
    x = src.load()
    dst.store(x * rms_scale(x, op.f32_np(0)))


def rms_norm_mul(op: OpCall) -> None:
    src, weight, dst = op.src(0), op.src(1), op.dst()
    same_shape(src, dst, "RMS_NORM_MUL")
    if weight.ne[0] != src.ne[0]:
        raise InvalidParamsError("RMS_NORM_MUL: the weight's rows differ from the input's")
    x = src.load()
    dst.store(x * rms_scale(x, op.f32_np(0)) * repeat_to(weight.load(), src.shape))


def norm(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "NORM")
    x = src.load()
    mean = (x.astype(np.float64).sum(axis=-1) / x.shape[-1]).astype(np.float32)[..., None]
    centered = x - mean
    variance = (centered.astype(np.float64) ** 2).mean(axis=-1).astype(np.float32)[..., None]
    dst.store(centered * (ONE / np.sqrt(variance + op.f32_np(0))))


def l2_norm(op: OpCall) -> None:
    src, dst = op.src(0), op.dst()
    same_shape(src, dst, "L2_NORM")
    x = src.load()
    total = (x * x).astype(np.float64).sum(axis=-1).astype(np.float32)
    scale = ONE / np.maximum(np.sqrt(total), op.f32_np(0))
    dst.store(x * scale[..., None])


def alibi_slopes(n_head: int, max_bias: float) -> F32:
    """The ALiBi slope of each head (1 when max_bias is 0), as ggml computes them."""
    if max_bias <= 0:
        return np.ones(n_head, np.float32)
    n_head_log2 = 1 << math.floor(math.log2(n_head))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_head_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_head_log2)
    heads = np.arange(n_head)
    low = m0 ** (heads + 1).astype(np.float32)
    high = m1 ** (2 * (heads - n_head_log2) + 1).astype(np.float32)
    return np.where(heads < n_head_log2, low, high).astype(np.float32)


def softmax(op: OpCall) -> None:
    src, mask_tensor, sinks_tensor, dst = op.src(0), op.optional(1), op.optional(2), op.dst()
    same_shape(src, dst, "SOFTMAX")
    scale, max_bias = op.f32_np(0), op.f32(1)
    x = src.load()
    slopes = alibi_slopes(src.ne[2], max_bias)[None, :, None, None]
    work = x * scale
    if mask_tensor is not None:
        mask = mask_tensor.load()
        if mask.shape[-1] != x.shape[-1] or mask.shape[-2] < x.shape[-2]:
            raise InvalidParamsError("SOFTMAX: the mask does not cover the rows")
        mask = repeat_to(mask[..., : x.shape[-2], :], x.shape)
        work = work + slopes * mask
    peak = work.max(axis=-1, keepdims=True)
    sink = None
    if sinks_tensor is not None:
        sink = sinks_tensor.load().reshape(-1)[: src.ne[2]][None, :, None, None]
        peak = np.maximum(peak, sink)
    exps = np.exp(work - peak)
    total = exps.astype(np.float64).sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - peak).astype(np.float64)
    dst.store(exps * (1.0 / total).astype(np.float32))


FUNCTIONS: Final[dict[Op, OpFunction]] = {
    Op.RMS_NORM: rms_norm,
    Op.RMS_NORM_MUL: rms_norm_mul,
    Op.NORM: norm,
    Op.L2_NORM: l2_norm,
    Op.SOFTMAX: softmax,
}

"""FLASH_ATTN_EXT, as ggml defines it (``ggml-cpu/ops.cpp``
``ggml_compute_forward_flash_attn_ext_f16_one_chunk``), in float32.

q ``[DK, N, H, B]``, k ``[DK, n_kv, H_kv, B_k]``, v ``[DV, n_kv, H_v, B_v]`` (f32,
f16 or q8_0; heads of k and v shared by ``H / H_kv`` consecutive q heads), an
optional f16 mask ``[n_kv, >= N, ...]`` broadcast over heads and sequences, optional
f32 sinks (one per head). op_params: scale, max_bias (ALiBi), logit_softcap. For each
query row: ``s = q.k * scale`` (with a softcap: ``softcap * tanh(s * scale /
softcap)``), plus ``slope * mask``; a softmax over the keys (and the head's sink);
the weighted sum of v. A row whose keys are all masked is 0. The output is
``[DV, H, N, B]`` (ggml's permute(0, 2, 1, 3) of the q layout), f32 or f16.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op
from npud.sim.htp.opcall import OpCall, OpFunction, as_f32, repeat_to
from npud.sim.htp.ops_norm import alibi_slopes
from npud.sim.htp.tensors import InvalidParamsError, check_scratch

F32 = npt.NDArray[np.float32]


def _broadcast_heads(values: F32, heads: int, batch: int, what: str) -> F32:
    """k or v (B_k, H_kv, n_kv, D) to (batch, heads, n_kv, D): q head h uses kv head
    h / (heads / H_kv), q sequence b uses b / (batch / B_k)."""
    if heads % values.shape[1] or batch % values.shape[0]:
        raise InvalidParamsError(f"FLASH_ATTN_EXT: {what} heads do not divide q's")
    values = np.repeat(values, heads // values.shape[1], axis=1)
    return np.repeat(values, batch // values.shape[0], axis=0)


def flash_attn_ext(op: OpCall) -> None:
    q_t, k_t, v_t = op.src(0), op.src(1), op.src(2)
    mask_t, sinks_t, dst = op.optional(3), op.optional(4), op.dst()
    batch, heads, rows, dk = q_t.shape  # (B, H, N, DK)
    if k_t.ne[0] != dk or v_t.ne[1] != k_t.ne[1]:
        raise InvalidParamsError("FLASH_ATTN_EXT: q, k and v do not fit")
    dv = v_t.ne[0]
    if dst.shape != (batch, rows, heads, dv):
        raise InvalidParamsError(f"FLASH_ATTN_EXT: {dst.describe()} is not [DV, H, N, B]")
    scale, max_bias, softcap = op.f32_np(0), op.f32(1), op.f32_np(2)
    n_kv = k_t.ne[1]
    # k and v repeated to every head, the scores and their weights
    check_scratch(batch * heads * n_kv * (dk + dv + 2 * rows), "FLASH_ATTN_EXT")
    q = q_t.load()
    k = _broadcast_heads(k_t.load(), heads, batch, "k")
    v = _broadcast_heads(v_t.load(), heads, batch, "v")
    n_kv = k.shape[2]
    scores = np.matmul(q, np.swapaxes(k, -1, -2))  # (B, H, N, n_kv)
    if softcap != 0:  # ggml: scale /= softcap; s = softcap * tanh(s * scale)
        scores = softcap * np.tanh(scores * (scale / softcap))
    else:
        scores *= scale
    if mask_t is not None:
        mask = mask_t.load()
        if mask.shape[-1] < n_kv or mask.shape[-2] < rows:
            raise InvalidParamsError("FLASH_ATTN_EXT: the mask does not cover q and k")
        mask = as_f32(repeat_to(mask[..., :rows, :n_kv], (batch, heads, rows, n_kv)))
        slopes = alibi_slopes(heads, max_bias)[None, :, None, None]
        scores = scores + slopes * mask
    peak = scores.max(axis=-1, keepdims=True)
    sinks = None
    if sinks_t is not None:
        sinks = sinks_t.load().reshape(-1)[:heads].astype(np.float32)[None, :, None, None]
        peak = np.maximum(peak, sinks)
    finite = np.isfinite(peak)
    shift = np.where(finite, peak, np.float32(0))
    weights = np.where(np.isneginf(scores), np.float32(0), np.exp(scores - shift))
    total = weights.sum(axis=-1, keepdims=True, dtype=np.float32)
    if sinks is not None:
        total = total + np.exp(sinks - shift)
    out = np.matmul(weights, v)  # (B, H, N, DV)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(total > 0, out / total, np.float32(0)).astype(np.float32)
    dst.store(np.swapaxes(out, 1, 2))  # (B, N, H, DV): [DV, H, N, B]


FUNCTIONS: Final[dict[Op, OpFunction]] = {Op.FLASH_ATTN_EXT: flash_attn_ext}

"""ROPE, as ggml-cpu computes it (``ggml-cpu/ops.cpp`` ``ggml_compute_forward_rope_flt``,
``ggml.c`` ``ggml_rope_yarn_corr_dims``).

x ``[ne0, heads, positions, ne3]`` (f32), positions src1 (i32; four per position for
the multi-section modes), optional frequency factors src2 (f32, ``n_dims / 2``).
op_params: [1] n_dims, [2] mode (0 normal, 2 neox, 8 mrope, 24 vision, 40 imrope),
[4] n_ctx_orig, [5..10] freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
beta_slow (floats), [11..14] sections, [15] n_offs (where the rotated dims start).

Per position ``p`` and pair ``k`` the angle is ``p * theta_scale^k`` (multiplied up
one factor at a time in float32, as ggml does), ``theta_scale = base^(-2 / n_dims)``,
divided by the pair's frequency factor, then YaRN: interpolated by freq_scale, mixed
back towards the extrapolated angle by the ramp between the correction dims times
ext_factor, magnitude attn_factor (times ``1 + 0.1 ln(1 / freq_scale)`` with YaRN).
Normal mode rotates adjacent pairs, the others pairs ``n_dims / 2`` apart; dims
outside ``[n_offs, n_offs + n_dims)`` are copied.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op
from npud.sim.htp.opcall import OpCall, OpFunction, same_shape
from npud.sim.htp.tensors import InvalidParamsError

F32 = npt.NDArray[np.float32]

MODE_NORMAL: Final = 0
MODE_NEOX: Final = 2
MODE_MROPE: Final = 8
MODE_VISION: Final = 24
MODE_IMROPE: Final = 40


def corr_dims(
    n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float
) -> tuple[np.float32, np.float32]:
    """ggml_rope_yarn_corr_dims (float32 like logf)."""

    def dim(n_rot: float) -> np.float32:
        ratio = np.float32(n_ctx_orig) / (np.float32(n_rot) * np.float32(2 * math.pi))
        return np.float32(
            np.float32(n_dims) * np.log(ratio) / (np.float32(2) * np.log(np.float32(freq_base)))
        )

    with np.errstate(all="ignore"):
        start = np.floor(dim(beta_fast))
        end = np.ceil(dim(beta_slow))
    return np.float32(max(0.0, float(start))), np.float32(min(n_dims - 1.0, float(end)))


class _Yarn:
    def __init__(self, op: OpCall, n_dims: int) -> None:
        self.freq_scale = op.f32_np(6)
        self.ext_factor = op.f32_np(7)
        self.attn_factor = op.f32_np(8)
        self.low, self.high = corr_dims(n_dims, op.i32(4), op.f32(5), op.f32(9), op.f32(10))

    def cos_sin(self, theta_extrap: F32, pair: int) -> tuple[F32, F32]:
        """rope_yarn for pair ``pair`` (i0 = 2 pair) of every position."""
        theta_interp = self.freq_scale * theta_extrap
        theta = theta_interp
        mscale = self.attn_factor
        if self.ext_factor != 0:
            y = (np.float32(pair) - self.low) / max(np.float32(0.001), self.high - self.low)
            ramp = np.float32(1) - min(np.float32(1), max(np.float32(0), np.float32(y)))
            mix = ramp * self.ext_factor
            theta = theta_interp * (np.float32(1) - mix) + theta_extrap * mix
            mscale = np.float32(
                mscale * (np.float32(1) + np.float32(0.1) * np.log(np.float32(1) / self.freq_scale))
            )
        return (np.cos(theta) * mscale).astype(np.float32), (np.sin(theta) * mscale).astype(
            np.float32
        )


def _cache(
    op: OpCall, positions: npt.NDArray[np.int64], n_pos: int, pairs: int, n_dims: int
) -> tuple[F32, F32]:
    """cos and sin, (n_pos, pairs), as ggml_rope_cache_init / ggml_mrope_cache_init."""
    mode = op.i32(2)
    theta_scale = np.float32(op.f32(5)) ** (np.float32(-2.0) / np.float32(n_dims))
    factors_t = op.optional(2)
    factors = None if factors_t is None else factors_t.load().reshape(-1)
    yarn = _Yarn(op, n_dims)
    cos = np.empty((n_pos, pairs), np.float32)
    sin = np.empty((n_pos, pairs), np.float32)
    multi = bool(mode & MODE_MROPE)
    if multi:
        sections = [op.i32(11 + i) for i in range(4)]
        if sections[0] <= 0 and sections[1] <= 0 and sections[2] <= 0:
            raise InvalidParamsError("ROPE: multi-section mode without sections")
        bases = [positions[i * n_pos : (i + 1) * n_pos].astype(np.float32) for i in range(4)]
    else:
        sections = [0, 0, 0, 0]
        bases = [positions[:n_pos].astype(np.float32)]
    thetas = [base.copy() for base in bases]
    sect_dims = sum(sections)
    sec_w = sections[0] + sections[1]
    sec_e = sections[2] + sec_w
    for pair in range(pairs):
        if multi:
            sector = pair % sect_dims
            if mode == MODE_VISION:  # independent sections restart their angles
                for start, which in ((0, 0), (sections[0], 1), (sec_w, 2), (sec_e, 3)):
                    if sector == start:
                        thetas[which] = bases[which].copy()
            theta = thetas[_section(mode, sector, sections)]
        else:
            theta = thetas[0]
        ff = np.float32(1) if factors is None else np.float32(factors[pair])
        cos[:, pair], sin[:, pair] = yarn.cos_sin((theta / ff).astype(np.float32), pair)
        for which, value in enumerate(thetas):
            thetas[which] = (value * theta_scale).astype(np.float32)
    return cos, sin


def _section(mode: int, sector: int, sections: list[int]) -> int:
    """Which position (t, h, w, e) a pair of a multi-section mode rotates by."""
    if mode == MODE_IMROPE:
        if sector % 3 == 1 and sector < 3 * sections[1]:
            return 1
        if sector % 3 == 2 and sector < 3 * sections[2]:
            return 2
        if sector % 3 == 0 and sector < 3 * sections[0]:
            return 0
        return 3
    sec_w = sections[0] + sections[1]
    if sections[0] <= sector < sec_w:
        return 1
    if sec_w <= sector < sec_w + sections[2]:
        return 2
    if sector >= sec_w + sections[2]:
        return 3
    return 0


def rope(op: OpCall) -> None:
    src, pos_t, dst = op.src(0), op.src(1), op.dst()
    same_shape(src, dst, "ROPE")
    n_dims, mode, n_offs = op.i32(1), op.i32(2), op.i32(15)
    ne0, n_pos = src.ne[0], src.ne[2]
    if mode not in (MODE_NORMAL, MODE_NEOX, MODE_MROPE, MODE_VISION, MODE_IMROPE):
        raise InvalidParamsError(f"ROPE: mode {mode}")
    if n_dims < 0 or n_dims % 2 or n_offs < 0 or n_offs % 2 or n_offs + n_dims > ne0:
        raise InvalidParamsError(f"ROPE: n_dims {n_dims}, n_offs {n_offs} for rows of {ne0}")
    vision = mode == MODE_VISION
    if vision and (n_dims != ne0 // 2 or n_offs):
        raise InvalidParamsError("ROPE: vision mode rotates half a row from 0")
    positions = pos_t.indices().reshape(-1)
    needed = 4 * n_pos if mode & MODE_MROPE else n_pos
    if positions.size < needed:
        raise InvalidParamsError("ROPE: fewer positions than rows")
    pairs = ne0 // 2 if vision else n_dims // 2
    x = src.load()
    out = x.copy()
    if pairs:
        cos, sin = _cache(op, positions, n_pos, pairs, n_dims)
        cos_b = cos[None, :, None, :]  # (1, positions, 1, pairs)
        sin_b = sin[None, :, None, :]
        if mode == MODE_NORMAL:
            first = x[..., n_offs : n_offs + n_dims : 2]
            second = x[..., n_offs + 1 : n_offs + n_dims : 2]
            out[..., n_offs : n_offs + n_dims : 2] = first * cos_b - second * sin_b
            out[..., n_offs + 1 : n_offs + n_dims : 2] = first * sin_b + second * cos_b
        else:  # pairs n_dims / 2 apart (vision: half a row, n_dims, apart)
            half = n_dims if vision else n_dims // 2
            first = x[..., n_offs : n_offs + pairs]
            second = x[..., n_offs + half : n_offs + half + pairs]
            out[..., n_offs : n_offs + pairs] = first * cos_b - second * sin_b
            out[..., n_offs + half : n_offs + half + pairs] = first * sin_b + second * cos_b
    dst.store(out)


FUNCTIONS: Final[dict[Op, OpFunction]] = {Op.ROPE: rope}

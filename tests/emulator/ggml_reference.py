"""Plain references for the htp tests, written from ggml's own definitions
(``ggml-quants.c``, ``ggml-cpu/ops.cpp``, ``ggml-hexagon.cpp`` ``repack_*_tiled``),
element by element or row by row where that is how ggml writes them, apart from the
emulator's vectorised code in :mod:`npud.sim.htp`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]

Q4_0, Q4_1, Q8_0, IQ4_NL, MXFP4 = 2, 3, 8, 20, 39
BLOCK: Final = {Q4_0: 18, Q4_1: 20, Q8_0: 34, IQ4_NL: 18, MXFP4: 17}
TILE: Final = {Q4_0: 576, Q4_1: 640, Q8_0: 1088, IQ4_NL: 576, MXFP4: 544}
KVALUES_IQ4NL: Final = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4: Final = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _half(raw: bytes) -> float:
    return float(np.frombuffer(raw, np.float16)[0])


# -- quantisation (ggml-quants.c, the _ref functions) -----------------------------------------


def quantize_q8_0(row: F32) -> bytes:
    out = b""
    for block in row.reshape(-1, 32):
        amax = float(np.max(np.abs(block)))
        d = amax / 127
        inverse = 1.0 / d if d else 0.0
        qs = [int(math.copysign(math.floor(abs(float(x) * inverse) + 0.5), x)) for x in block]
        out += np.float16(d).tobytes() + struct.pack("<32b", *qs)
    return out


def quantize_q4_0(row: F32) -> bytes:
    out = b""
    for block in row.reshape(-1, 32):
        peak = float(block[int(np.argmax(np.abs(block)))])
        d = peak / -8
        inverse = 1.0 / d if d else 0.0
        q = [min(15, int(float(x) * inverse + 8.5)) for x in block]
        packed = bytes(q[j] | (q[j + 16] << 4) for j in range(16))
        out += np.float16(d).tobytes() + packed
    return out


def random_blocks(rng: np.random.Generator, kind: int, rows: int, blocks: int) -> bytes:
    """Valid blocks with random scales and quants (every type, for decoders' tests)."""
    out = b""
    for _ in range(rows * blocks):
        qs = rng.integers(0, 256, 16 if kind != Q8_0 else 32, dtype=np.uint8).tobytes()
        d = np.float16(rng.uniform(0.001, 0.05)).tobytes()
        if kind == Q4_1:
            out += d + np.float16(rng.uniform(-0.2, 0.2)).tobytes() + qs
        elif kind == MXFP4:
            out += bytes([int(rng.integers(118, 130))]) + qs
        else:
            out += d + qs
    return out


def dequantize(data: bytes, kind: int) -> F32:
    """dequantize_row_* of a run of blocks."""
    size = BLOCK[kind]
    values: list[float] = []
    for start in range(0, len(data), size):
        b = data[start : start + size]
        if kind == Q8_0:
            d = _half(b[0:2])
            values += [q * d for q in struct.unpack("<32b", b[2:34])]
            continue
        if kind == MXFP4:
            d = math.ldexp(1.0, b[0] - 128)
            qs = b[1:17]
            lo = [KVALUES_MXFP4[q & 15] * d for q in qs]
            hi = [KVALUES_MXFP4[q >> 4] * d for q in qs]
        elif kind == Q4_1:
            d, m = _half(b[0:2]), _half(b[2:4])
            lo = [(q & 15) * d + m for q in b[4:20]]
            hi = [(q >> 4) * d + m for q in b[4:20]]
        elif kind == IQ4_NL:
            d = _half(b[0:2])
            lo = [KVALUES_IQ4NL[q & 15] * d for q in b[2:18]]
            hi = [KVALUES_IQ4NL[q >> 4] * d for q in b[2:18]]
        else:
            d = _half(b[0:2])
            lo = [((q & 15) - 8) * d for q in b[2:18]]
            hi = [((q >> 4) - 8) * d for q in b[2:18]]
        values += lo + hi
    return np.array(values, np.float32)


def _nibbles(block: bytes, kind: int) -> list[int]:
    qs = block[4:20] if kind == Q4_1 else block[1:17] if kind == MXFP4 else block[2:18]
    return [q & 15 for q in qs] + [q >> 4 for q in qs]


def repack_tiled(data: bytes, kind: int, ne0: int, ne1: int) -> bytes:
    """repack_*_tiled of one 2-D slice (ne1 rows of ne0 elements) of plain blocks."""
    size = BLOCK[kind]
    per_row = ne0 // 32
    n_ct, n_kt = -(-ne1 // 32), -(-ne0 // 32)
    tile = TILE[kind]
    out = bytearray(n_ct * n_kt * tile)
    for ct in range(n_ct):
        for kt in range(n_kt):
            base = (ct * n_kt + kt) * tile
            for row in range(32):
                r = ct * 32 + row
                present = r < ne1 and kt < per_row
                block = data[(r * per_row + kt) * size :][:size] if present else b""
                if kind == Q8_0:
                    qs = block[2:34] if present else bytes(32)
                    for cp in range(16):
                        out[base + cp * 64 + 2 * row] = qs[2 * cp]
                        out[base + cp * 64 + 2 * row + 1] = qs[2 * cp + 1]
                    out[base + 1024 + 2 * row : base + 1026 + 2 * row] = (
                        block[0:2] if present else bytes(2)
                    )
                    continue
                pad = 8 if kind in (Q4_0, IQ4_NL) else 0
                q = _nibbles(block, kind) if present else [pad] * 32
                for cp in range(16):
                    out[base + cp * 32 + row] = q[2 * cp] | (q[2 * cp + 1] << 4)
                if kind == Q4_1:
                    scales = block[0:4] if present else bytes(4)
                    out[base + 512 + 4 * row : base + 516 + 4 * row] = scales
                elif kind == MXFP4:
                    out[base + 512 + row] = block[0] if present else 0
                else:
                    out[base + 512 + 2 * row : base + 514 + 2 * row] = (
                        block[0:2] if present else bytes(2)
                    )
    return bytes(out)


# -- ops ---------------------------------------------------------------------------------------


def rms_norm(x: F32, eps: float) -> F64:
    x64 = x.astype(np.float64)
    return np.asarray(x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps), np.float64)


def softmax_row(row: F64) -> F64:
    finite = row[np.isfinite(row)]
    if finite.size == 0:
        return np.zeros_like(row)
    e = np.exp(row - finite.max())
    return np.asarray(e / e.sum(), np.float64)


def alibi_slope(head: int, n_head: int, max_bias: float) -> float:
    if max_bias <= 0:
        return 1.0
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return float(m0 ** (head + 1) if head < n_log2 else m1 ** (2 * (head - n_log2) + 1))


def rope_row(
    row: F32,
    pos: int,
    n_dims: int,
    neox: bool,
    base: float,
    freq_factors: F32 | None = None,
    n_offs: int = 0,
) -> F64:
    """One row of ROPE with freq_scale 1 and no YaRN (ext_factor 0), attn_factor 1."""
    out = row.astype(np.float64).copy()
    for pair in range(n_dims // 2):
        theta = pos * base ** (-2.0 * pair / n_dims)
        if freq_factors is not None:
            theta /= float(freq_factors[pair])
        c, s = math.cos(theta), math.sin(theta)
        i, j = (
            (n_offs + pair, n_offs + pair + n_dims // 2)
            if neox
            else (
                n_offs + 2 * pair,
                n_offs + 2 * pair + 1,
            )
        )
        x0, x1 = float(row[i]), float(row[j])
        out[i] = x0 * c - x1 * s
        out[j] = x0 * s + x1 * c
    return out


def attention(
    q: F32,
    k: F32,
    v: F32,
    mask: F32 | None,
    scale: float,
    max_bias: float = 0.0,
    softcap: float = 0.0,
    sinks: F32 | None = None,
) -> F64:
    """FLASH_ATTN_EXT: q (H, N, DK), k (H_kv, n_kv, DK), v (H_kv, n_kv, DV), mask (N, n_kv);
    the result (N, H, DV), as ggml lays out dst[DV, H, N]."""
    heads, rows, _ = q.shape
    out = np.zeros((rows, heads, v.shape[2]))
    group = heads // k.shape[0]
    for h in range(heads):
        slope = alibi_slope(h, heads, max_bias)
        for n in range(rows):
            scores = k[h // group].astype(np.float64) @ q[h, n].astype(np.float64) * scale
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            if mask is not None:
                scores = scores + slope * mask[n].astype(np.float64)
            if sinks is not None:
                scores = np.append(scores, float(sinks[h]))
            weights = softmax_row(scores)[: k.shape[1]]
            out[n, h] = weights @ v[h // group].astype(np.float64)
    return out


def rope_yarn_row(
    row: F32,
    pos: int,
    n_dims: int,
    neox: bool,
    base: float,
    freq_scale: float,
    ext_factor: float,
    attn_factor: float,
    beta_fast: float,
    beta_slow: float,
    n_ctx_orig: int,
) -> F64:
    """One row of ROPE with YaRN, ggml's rope_yarn / ggml_rope_yarn_corr_dims in doubles."""

    def corr(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr(beta_fast)))
    high = min(n_dims - 1.0, math.ceil(corr(beta_slow)))
    out = row.astype(np.float64).copy()
    for pair in range(n_dims // 2):
        extrap = pos * base ** (-2.0 * pair / n_dims)
        interp = freq_scale * extrap
        theta, mscale = interp, attn_factor
        if ext_factor:
            ramp = 1 - min(1.0, max(0.0, (pair - low) / max(0.001, high - low)))
            mix = ramp * ext_factor
            theta = interp * (1 - mix) + extrap * mix
            mscale *= 1 + 0.1 * math.log(1 / freq_scale)
        c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
        i, j = (pair, pair + n_dims // 2) if neox else (2 * pair, 2 * pair + 1)
        x0, x1 = float(row[i]), float(row[j])
        out[i] = x0 * c - x1 * s
        out[j] = x0 * s + x1 * c
    return out


def mrope_row(  # noqa: PLR0912 - ggml's branches, one for one
    row: F32,
    positions: Sequence[int],
    n_dims: int,
    mode: int,
    sections: tuple[int, int, int, int],
    base: float,
) -> F64:
    """One row of ROPE in a multi-section mode (8 mrope, 40 imrope, 24 vision), from
    ggml_mrope_cache_init and rotate_pairs, without YaRN."""
    vision, imrope = mode == 24, mode == 40
    ne0 = row.shape[0]
    scale = base ** (-2.0 / n_dims)
    bases = [float(p) for p in positions]
    thetas = list(bases)
    sect_dims = sum(sections)
    sec_w = sections[0] + sections[1]
    sec_e = sections[2] + sec_w
    cache: list[tuple[float, float]] = []
    for i0 in range(0, ne0, 2):
        sector = (i0 // 2) % sect_dims
        if vision:
            for start, which in ((0, 0), (sections[0], 1), (sec_w, 2), (sec_e, 3)):
                if sector == start:
                    thetas[which] = bases[which]
        theta = thetas[0]
        if imrope:
            if sector % 3 == 1 and sector < 3 * sections[1]:
                theta = thetas[1]
            elif sector % 3 == 2 and sector < 3 * sections[2]:
                theta = thetas[2]
            elif sector % 3 == 0 and sector < 3 * sections[0]:
                theta = thetas[0]
            else:
                theta = thetas[3]
        elif sections[0] <= sector < sec_w:
            theta = thetas[1]
        elif sec_w <= sector < sec_w + sections[2]:
            theta = thetas[2]
        elif sector >= sec_w + sections[2]:
            theta = thetas[3]
        cache.append((math.cos(theta), math.sin(theta)))
        thetas = [t * scale for t in thetas]
    out = row.astype(np.float64).copy()
    pairs, apart = (ne0 // 2, n_dims) if vision else (n_dims // 2, n_dims // 2)
    for pair in range(pairs):
        c, s = cache[pair]
        x0, x1 = float(row[pair]), float(row[pair + apart])
        out[pair] = x0 * c - x1 * s
        out[pair + apart] = x0 * s + x1 * c
    return out

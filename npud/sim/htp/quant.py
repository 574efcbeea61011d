"""ggml's block formats in numpy: the plain layouts (``ggml-common.h``) and the tiled
("repacked") layouts ggml-hexagon's host writes into weight buffers.

Plain blocks of 32 elements: q4_0 ``{f16 d; u8 qs[16]}`` (element j < 16 is the low
nibble of ``qs[j]``, j >= 16 the high nibble of ``qs[j - 16]``; value ``(q - 8) d``),
q4_1 ``{f16 d, m; u8 qs[16]}`` (``q d + m``), q8_0 ``{f16 d; i8 qs[32]}``
(``q d``), iq4_nl ``{f16 d; u8 qs[16]}`` (``kvalues_iq4nl[q] d``), mxfp4
``{u8 e; u8 qs[16]}`` (``kvalues_mxfp4[q] 2^(e - 128)``).

Tiled layout (``ggml-hexagon.cpp`` ``repack_*_tiled``), for a weight of ``ne1`` rows
of ``ne0`` elements per 2-D slice: rows and columns are padded to multiples of 32
(``ne0p``, ``ne1p``); a slice is ``ne1p / 32`` column tiles by ``ne0p / 32`` K tiles,
tile ``(ct, kt)`` at ``(ct * n_kt + kt) * TILE``, holding K block ``kt`` (elements
``32 kt .. 32 kt + 31``) of rows ``32 ct .. 32 ct + 31``:

* q4_0, iq4_nl (TILE 576): ``byte[cp * 32 + row] = q[row][2 cp] | q[row][2 cp + 1] << 4``
  for ``cp`` 0..15 (``q[row][j]`` the 4-bit index of element j of the row's block),
  then the 32 rows' f16 ``d`` at 512;
* q4_1 (TILE 640): quants as q4_0, then the rows' f16 pairs ``{d, m}`` at 512;
* q8_0 (TILE 1088): ``byte[cp * 64 + 2 row + e] = qs[row][2 cp + e]``, f16 ``d`` at 1024;
* mxfp4 (TILE 544): quants as q4_0, the rows' ``e`` bytes at 512.

Padding rows and blocks have scale 0. K-quants (q4_K, q5_K, q6_K) are not decoded.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Type

QK: Final = 32
BLOCK_BYTES: Final = {
    Type.Q4_0: 18,
    Type.Q4_1: 20,
    Type.Q8_0: 34,
    Type.IQ4_NL: 18,
    Type.MXFP4: 17,
}
"""Bytes of one 32-element block of each plain quantized type the emulator decodes."""
TILE_BYTES: Final = {
    Type.Q4_0: 576,
    Type.IQ4_NL: 576,
    Type.Q4_1: 640,
    Type.Q8_0: 1088,
    Type.MXFP4: 544,
}

KVALUES_IQ4NL: Final = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)
KVALUES_MXFP4: Final = np.array(
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32
)

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]


def _f16(raw: U8) -> F32:
    """Little-endian f16 pairs in the last axis of ``raw`` (..., 2k) as float32 (..., k)."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _e8m0_half(raw: U8) -> F32:
    """ggml_e8m0_to_fp32_half: 2^(e - 128), exactly (denormal for e < 2)."""
    return np.ldexp(np.float32(1), raw.astype(np.int32) - 128).astype(np.float32)


def _nibbles(qs: U8) -> U8:
    """A block's 16 bytes (..., 16) as its 32 indexes (..., 32): low nibbles, then high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def dequantize(raw: U8, kind: Type) -> F32:
    """Plain blocks (..., n * BLOCK_BYTES) as float32 (..., n * 32)."""
    size = BLOCK_BYTES.get(kind)
    if size is None:
        raise ValueError(f"type {kind.name} is not a decodable block type")
    blocks = raw.reshape(*raw.shape[:-1], raw.shape[-1] // size, size)
    if kind is Type.Q8_0:
        d = _f16(blocks[..., 0:2])
        values = blocks[..., 2:34].view(np.int8).astype(np.float32) * d
    elif kind is Type.MXFP4:
        scale = _e8m0_half(blocks[..., 0:1])
        values = KVALUES_MXFP4[_nibbles(blocks[..., 1:17])] * scale
    elif kind is Type.Q4_1:
        d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        values = _nibbles(blocks[..., 4:20]).astype(np.float32) * d + m
    elif kind is Type.IQ4_NL:
        d = _f16(blocks[..., 0:2])
        values = KVALUES_IQ4NL[_nibbles(blocks[..., 2:18])] * d
    else:  # Q4_0
        d = _f16(blocks[..., 0:2])
        values = (_nibbles(blocks[..., 2:18]).astype(np.float32) - 8.0) * d
    return values.reshape(*raw.shape[:-1], -1).astype(np.float32, copy=False)


def quantize_q8_0(values: F32) -> U8:
    """quantize_row_q8_0_ref: rows (..., n * 32) as q8_0 blocks (..., n * 34)."""
    x = values.astype(np.float32).reshape(*values.shape[:-1], values.shape[-1] // QK, QK)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0))
    scaled = (x * inverse.astype(np.float32)).astype(np.float64)
    rounded = np.where(scaled >= 0, np.floor(scaled + 0.5), np.ceil(scaled - 0.5))  # roundf
    out = np.empty((*x.shape[:-1], 34), np.uint8)
    out[..., 0:2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:34] = rounded.astype(np.int8).view(np.uint8)
    return out.reshape(*values.shape[:-1], -1)


# -- tiles -------------------------------------------------------------------------------------


def _tile_nibbles(quants: U8) -> U8:
    """A tile's 512 quant bytes (..., 512), laid out [cp][row], as indexes [row][col]."""
    pairs = quants.reshape(*quants.shape[:-1], 16, 32)  # [cp][row]
    columns = np.stack([pairs & 0x0F, pairs >> 4], axis=-2)  # [cp][lo/hi][row]
    columns = columns.reshape(*quants.shape[:-1], 32, 32)  # [col = 2 cp + e][row]
    return np.swapaxes(columns, -1, -2)


def decode_tiles(raw: U8, kind: Type, ne0p: int, ne1p: int) -> F32:
    """Tiled slices (..., slice bytes) as float32 (..., ne1p, ne0p)."""
    tile = TILE_BYTES.get(kind)
    if tile is None:
        raise ValueError(f"type {kind.name} has no tiled layout the emulator decodes")
    n_kt, n_ct = ne0p // QK, ne1p // QK
    lead = raw.shape[:-1]
    tiles = raw[..., : n_ct * n_kt * tile].reshape(*lead, n_ct, n_kt, tile)
    if kind is Type.Q8_0:
        signed = tiles[..., :1024].view(np.int8).reshape(*lead, n_ct, n_kt, 16, 32, 2)  # cp,row,e
        qs = np.swapaxes(signed, -3, -2).reshape(*lead, n_ct, n_kt, 32, 32).astype(np.float32)
        values = qs * _f16(tiles[..., 1024:1088])[..., :, None]
    else:
        q = _tile_nibbles(tiles[..., :512])
        if kind is Type.Q4_0:
            values = (q.astype(np.float32) - 8.0) * _f16(tiles[..., 512:576])[..., :, None]
        elif kind is Type.IQ4_NL:
            values = KVALUES_IQ4NL[q] * _f16(tiles[..., 512:576])[..., :, None]
        elif kind is Type.Q4_1:
            dm = _f16(tiles[..., 512:640]).reshape(*lead, n_ct, n_kt, 32, 2)
            values = q.astype(np.float32) * dm[..., 0, None] + dm[..., 1, None]
        else:  # MXFP4
            values = KVALUES_MXFP4[q] * _e8m0_half(tiles[..., 512:544])[..., :, None]
    # (..., ct, kt, row, col) -> (..., ct, row, kt, col) -> (..., ne1p, ne0p)
    values = np.swapaxes(values, -3, -2).reshape(*lead, ne1p, ne0p)
    return values.astype(np.float32, copy=False)

"""Tensors of an op batch as numpy arrays over the mapped buffers, in place.

An ``htp_tensor`` names a buffer of the batch (``bi``), a byte offset in it (``data``)
and ggml's shape: ``ne[0]`` elements innermost, ``nb[i]`` the byte stride of
dimension ``i``. Here a tensor is an array of shape ``(ne3, ne2, ne1, ne0)`` with
strides ``(nb3, nb2, nb1, nb0)`` (:meth:`Tensor.array`): a view of the buffer, so
several tensors may be views of the same memory, as in ggml. Outputs are written in
place (:meth:`Tensor.store`). Quantized tensors are read through their blocks:
rows of plain blocks, or the tiled slices of a repacked weight
(:mod:`npud.sim.htp.quant`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from npud.sim.htp import quant
from npud.sim.htp.layout import TENSOR_REPACK, Status, TensorDesc, Type

F32 = npt.NDArray[np.float32]
Array = npt.NDArray[np.generic]

NATIVE: Final[dict[int, type[np.generic]]] = {
    Type.F32: np.float32,
    Type.F16: np.float16,
    Type.I32: np.int32,
    Type.I64: np.int64,
}


MAX_SCRATCH_BYTES: Final = 1 << 30
"""What one op may allocate beyond its tensors' own sizes (float32 copies, broadcasts,
intermediate products), at most; an op that would need more is refused INVAL_PARAMS
before it allocates (:func:`check_scratch`)."""


class OpError(Exception):
    """An op that cannot run: ``status`` is what the batch answers."""

    status: Status = Status.INTERNAL_ERR


class NotSupportedError(OpError):
    status = Status.NO_SUPPORT


class InvalidParamsError(OpError):
    status = Status.INVAL_PARAMS


def check_scratch(elements: int, what: str) -> None:
    """Refuse an op whose working arrays would hold ``elements`` float32 values past
    :data:`MAX_SCRATCH_BYTES`."""
    if elements * 4 > MAX_SCRATCH_BYTES:
        raise InvalidParamsError(
            f"{what} needs {elements * 4} bytes of scratch (at most {MAX_SCRATCH_BYTES})"
        )


def type_name(kind: int) -> str:
    try:
        return Type(kind).name
    except ValueError:
        return f"type {kind}"


class Tensor:
    """One ``htp_tensor`` of a batch over the memory of its buffer."""

    def __init__(self, index: int, desc: TensorDesc, memory: memoryview) -> None:
        self.index = index
        self.desc = desc
        self.type = desc.type
        self.ne = desc.ne
        self.nb = desc.nb
        self.flags = desc.flags
        self._memory = memory

    # -- shape ----------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(ne3, ne2, ne1, ne0): numpy's order of ggml's dimensions."""
        ne = self.ne
        return (ne[3], ne[2], ne[1], ne[0])

    @property
    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def repacked(self) -> bool:
        return bool(self.flags & TENSOR_REPACK)

    def describe(self) -> str:
        ne = ",".join(str(n) for n in self.ne)
        nb = ",".join(str(n) for n in self.nb)
        return f"#{self.index} {type_name(self.type)} ne {ne} nb {nb}"

    def _check_extent(self, last: int, dims: Sequence[int]) -> None:
        """The bytes from ``data`` to the end of the last element (``last`` bytes, at the
        far end of the dimensions ``dims``) lie in the buffer."""
        if self.nelements == 0:
            return
        end = self.desc.data + last + sum((self.ne[i] - 1) * self.nb[i] for i in dims)
        if end > len(self._memory):
            raise InvalidParamsError(
                f"tensor {self.describe()} at offset {self.desc.data} reaches byte {end} of a"
                f" {len(self._memory)}-byte buffer"
            )

    def packed_bytes(self) -> int | None:
        """The bytes of the tensor's elements laid out without gaps: what a copy of it
        takes in its own type (None for a type the emulator does not know)."""
        ne, kind = self.ne, self.type
        if kind in NATIVE and not self.repacked:
            return self.nelements * np.dtype(NATIVE[kind]).itemsize
        if kind in quant.BLOCK_BYTES:
            size = quant.BLOCK_BYTES[Type(kind)]
            return -(-ne[0] // quant.QK) * size * self.nrows
        return None

    def check_fits(self) -> None:
        """The tensor's elements fit its buffer from its offset, both ways: its last
        element lies in the buffer (its strided extent, ne x nb), and the buffer from its
        offset holds as many bytes as its elements packed (so zero or overlapping
        strides cannot make an op copy more than the buffer holds: a CPY of 2^29 f32
        elements over 4 bytes). InvalidParamsError otherwise; nothing is allocated."""
        size = len(self._memory)
        if self.desc.data > size:
            raise InvalidParamsError(
                f"tensor {self.describe()} at offset {self.desc.data} of a {size}-byte buffer"
            )
        packed = self.packed_bytes()
        if packed is not None and packed > size - self.desc.data:
            raise InvalidParamsError(
                f"tensor {self.describe()} holds {packed} bytes of elements; its buffer has"
                f" {size - self.desc.data} from offset {self.desc.data}"
            )
        if packed is not None and self.nelements:
            extent = sum((self.ne[i] - 1) * self.nb[i] for i in range(4))
            if self.desc.data + extent > size:
                raise InvalidParamsError(
                    f"tensor {self.describe()} at offset {self.desc.data} reaches byte"
                    f" {self.desc.data + extent} of a {size}-byte buffer"
                )

    # -- views ----------------------------------------------------------------------------

    def array(self) -> Array:
        """The tensor's elements in place (f32, f16, i32, i64)."""
        dtype = NATIVE.get(self.type)
        if dtype is None:
            raise NotSupportedError(f"tensor {self.describe()}: not an element type here")
        if self.repacked:
            raise NotSupportedError(f"tensor {self.describe()}: repacked, not elements")
        itemsize = np.dtype(dtype).itemsize
        self._check_extent(itemsize, range(4))
        nb = self.nb
        return np.ndarray(
            self.shape,
            dtype,
            buffer=self._memory,
            offset=self.desc.data,
            strides=(nb[3], nb[2], nb[1], nb[0]),
        )

    def rows(self) -> npt.NDArray[np.uint8]:
        """The bytes of each row of plain quantized blocks: (ne3, ne2, ne1, row bytes)."""
        kind = self.type
        size = quant.BLOCK_BYTES.get(Type(kind)) if kind in quant.BLOCK_BYTES else None
        if size is None or self.repacked:
            raise NotSupportedError(f"tensor {self.describe()}: not plain blocks the DSP reads")
        if self.ne[0] % quant.QK:
            raise InvalidParamsError(f"tensor {self.describe()}: ne0 is not whole blocks")
        row = self.ne[0] // quant.QK * size
        self._check_extent(row, (1, 2, 3))
        ne, nb = self.ne, self.nb
        return np.ndarray(
            (ne[3], ne[2], ne[1], row),
            np.uint8,
            buffer=self._memory,
            offset=self.desc.data,
            strides=(nb[3], nb[2], nb[1], 1),
        )

    def tiles(self) -> npt.NDArray[np.uint8]:
        """The bytes of each tiled slice of a repacked weight: (ne3, ne2, slice bytes)."""
        kind = self.type
        tile = quant.TILE_BYTES.get(Type(kind)) if kind in quant.TILE_BYTES else None
        if tile is None:
            raise NotSupportedError(f"tensor {self.describe()}: no tiled layout this DSP reads")
        ne, nb = self.ne, self.nb
        if ne[0] % quant.QK or ne[1] % quant.QK:
            raise InvalidParamsError(f"tensor {self.describe()}: a tiled weight not in 32s")
        size = (ne[0] // quant.QK) * (ne[1] // quant.QK) * tile
        self._check_extent(size, (2, 3))
        return np.ndarray(
            (ne[3], ne[2], size),
            np.uint8,
            buffer=self._memory,
            offset=self.desc.data,
            strides=(nb[3], nb[2], 1),
        )

    def words(self, count: int) -> npt.NDArray[np.uint32]:
        """``count`` u32 at the tensor's first byte, in place (a fence slot), whatever its
        type."""
        if self.desc.data + 4 * count > len(self._memory) or self.desc.data % 4:
            raise InvalidParamsError(f"tensor {self.describe()}: no room for {count} words")
        return np.ndarray((count,), np.uint32, buffer=self._memory, offset=self.desc.data)

    def load(self) -> F32:
        """The values as float32, shape (ne3, ne2, ne1, ne0) (a repacked weight: the padded
        ne). Read-only; a view of the memory for f32."""
        kind = self.type
        if self.repacked:
            values = quant.decode_tiles(self.tiles(), Type(kind), self.ne[0], self.ne[1])
        elif kind in NATIVE:
            view = self.array()
            if kind == Type.F32:
                view.flags.writeable = False
                return view  # type: ignore[return-value]
            values = view.astype(np.float32)
        elif kind in quant.BLOCK_BYTES:
            values = quant.dequantize(self.rows(), Type(kind))
        else:
            raise NotSupportedError(f"tensor {self.describe()}: type not decoded by this DSP")
        values.flags.writeable = False
        return values

    def indices(self) -> npt.NDArray[np.int64]:
        """An index tensor (i32 or i64) as int64, shape (ne3, ne2, ne1, ne0)."""
        if self.type not in (Type.I32, Type.I64):
            raise InvalidParamsError(f"tensor {self.describe()}: indices must be i32 or i64")
        return self.array().astype(np.int64)

    def store(self, values: npt.ArrayLike) -> None:
        """Write ``values`` (broadcast to the shape) in place, converted to the type."""
        kind = self.type
        if kind in NATIVE and not self.repacked:
            view = self.array()
            data = np.asarray(values)
            if kind in (Type.I32, Type.I64) and data.dtype.kind == "f":
                with np.errstate(invalid="ignore"):
                    data = np.trunc(data)  # C's float-to-int conversion
            view[...] = np.broadcast_to(data, view.shape).astype(view.dtype)
            return
        if kind == Type.Q8_0 and not self.repacked:
            rows = self.rows()
            data = np.broadcast_to(np.asarray(values, np.float32), self.shape)
            rows[...] = quant.quantize_q8_0(np.ascontiguousarray(data))
            return
        raise NotSupportedError(f"tensor {self.describe()}: this DSP does not write the type")

"""One op of a batch as an op function sees it, and what ops share.

An op function takes an :class:`OpCall` (its code, its ggml ``op_params``, its
source and destination tensors) and writes its outputs in place; it raises
:class:`~npud.sim.htp.tensors.OpError` for what it cannot do. ``kernel_params``
(the host's tiling and VTCM plan for the real kernels) is not needed to compute
the result and is ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from npud.sim.htp.layout import Op
from npud.sim.htp.tensors import InvalidParamsError, Tensor

F32 = npt.NDArray[np.float32]
A = TypeVar("A", bound=npt.NDArray[np.generic])
_I32: Final = struct.Struct("<i")
_F32: Final = struct.Struct("<f")


class OpCall:
    def __init__(
        self,
        code: Op,
        params: Sequence[int],
        srcs: Sequence[Tensor | None],
        dsts: Sequence[Tensor | None],
        status: int = 1,
    ) -> None:
        """``status``: the batch's status before this op (the first failure, or OK)."""
        self.code = code
        self.params = tuple(params)
        self.srcs = tuple(srcs)
        self.dsts = tuple(dsts)
        self.status = status

    def src(self, index: int) -> Tensor:
        tensor = self.srcs[index] if index < len(self.srcs) else None
        if tensor is None:
            raise InvalidParamsError(f"{self.code.name} needs source {index}")
        return tensor

    def optional(self, index: int) -> Tensor | None:
        return self.srcs[index] if index < len(self.srcs) else None

    def dst(self, index: int = 0) -> Tensor:
        tensor = self.dsts[index] if index < len(self.dsts) else None
        if tensor is None:
            raise InvalidParamsError(f"{self.code.name} needs destination {index}")
        return tensor

    @property
    def n_srcs(self) -> int:
        """Sources up to the last one present."""
        count = 0
        for index, tensor in enumerate(self.srcs):
            if tensor is not None:
                count = index + 1
        return count

    @property
    def n_dsts(self) -> int:
        return sum(1 for tensor in self.dsts if tensor is not None)

    def i32(self, index: int) -> int:
        return self.params[index]

    def f32(self, index: int) -> float:
        """op_params[index] read as the float ggml stored there (bits kept)."""
        (value,) = _F32.unpack(_I32.pack(self.params[index]))
        return float(value)

    def f32_np(self, index: int) -> np.float32:
        return np.float32(self.f32(index))


OpFunction = Callable[[OpCall], None]


def same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.ne != b.ne:
        raise InvalidParamsError(f"{what}: {a.describe()} and {b.describe()} differ in shape")


def repeat_to(values: A, shape: Sequence[int]) -> A:
    """ggml's broadcast: ``values`` repeated (tiled) along each dimension to ``shape``;
    each target extent must be a multiple of the source's (ggml_can_repeat)."""
    reps = []
    for have, want in zip(values.shape, shape, strict=True):
        if have == 0 or want % have:
            raise InvalidParamsError(f"cannot repeat shape {values.shape} to {tuple(shape)}")
        reps.append(want // have)
    if all(r == 1 for r in reps):
        return values
    if all(have == 1 or r == 1 for have, r in zip(values.shape, reps, strict=True)):
        return np.broadcast_to(values, tuple(shape))  # type: ignore[return-value]
    return np.tile(values, reps)  # type: ignore[return-value]


def as_f32(values: npt.ArrayLike) -> F32:
    """``values`` as a float32 array (no copy when it is one)."""
    return np.asarray(values, np.float32)


def f16_round(values: F32) -> F32:
    """Through f16 and back, as ggml's f16 tables and conversions round."""
    return values.astype(np.float16).astype(np.float32)

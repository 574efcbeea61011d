"""A value an ONNX model's input is fixed to at load (``constants=``), as it travels.

Pure data shared by the daemon (which carries it in the model URI) and the emulated
DSP (which folds it into the model: :mod:`npud.sim.onnx_fold`).
"""

from __future__ import annotations

import dataclasses
from typing import Final

DTYPES: Final = frozenset(
    {"bool", "float32", "float64"}
    | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
)
"""The numpy types a value may be given in (the DSP converts within a kind)."""


@dataclasses.dataclass(frozen=True)
class Constant:
    """A value to fix an input to: its numpy dtype name, shape and values (row-major)."""

    dtype: str
    shape: tuple[int, ...]
    values: tuple[int | float, ...]

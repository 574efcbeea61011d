"""What a loaded portal_qnn model is, as the host sees it: its tensors' data types,
specs and arena layout, its graphs and its slot (npud.fastrpc.stubs.portal_qnn)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Final

from npud import idl
from npud.fastrpc.stubs.model_errors import ModelError, ModelFailure
from npud.fastrpc.stubs.model_format import Sniffed
from npud.fastrpc.stubs.portal_limits import MAX_RANK
from npud.idl import arena

TensorKey = int | str


class DataType(enum.IntEnum):
    """QNN's data type codes, as graph_info reports them (skel/include/qnn_min.h)."""

    INT8 = 0x0008
    INT16 = 0x0016
    INT32 = 0x0032
    INT64 = 0x0064
    UINT8 = 0x0108
    UINT16 = 0x0116
    UINT32 = 0x0132
    UINT64 = 0x0164
    FLOAT16 = 0x0216
    FLOAT32 = 0x0232
    SFIXED8 = 0x0308
    SFIXED16 = 0x0316
    SFIXED32 = 0x0332
    UFIXED8 = 0x0408
    UFIXED16 = 0x0416
    UFIXED32 = 0x0432
    BOOL = 0x0508

    @property
    def numpy(self) -> str:
        """The numpy dtype name holding this type's bytes (fixed point: the raw integers)."""
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.numpy]

    @classmethod
    def from_name(cls, name: str) -> DataType:
        """From this enum's name, a numpy dtype name (``float32``...) or a short one (``f32``)."""
        key = name.lower()
        found = _BY_NAME.get(key)
        if found is None:
            raise ValueError(f"unknown data type {name!r}")
        return found


_NUMPY: Final = {
    DataType.INT8: "int8",
    DataType.INT16: "int16",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.UINT8: "uint8",
    DataType.UINT16: "uint16",
    DataType.UINT32: "uint32",
    DataType.UINT64: "uint64",
    DataType.FLOAT16: "float16",
    DataType.FLOAT32: "float32",
    DataType.SFIXED8: "int8",
    DataType.SFIXED16: "int16",
    DataType.SFIXED32: "int32",
    DataType.UFIXED8: "uint8",
    DataType.UFIXED16: "uint16",
    DataType.UFIXED32: "uint32",
    DataType.BOOL: "bool",
}
_SHORT: Final = {"i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8"}
_SHORT.update({"u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16"})
_SHORT.update({"f32": "float32", "b8": "bool"})
_PLAIN: Final = [t for t in DataType if not t.name[1:].startswith("FIXED")]
_BY_NAME: Final = {
    **{t.name.lower(): t for t in DataType},
    **{t.numpy: t for t in _PLAIN},
    **{short: next(t for t in _PLAIN if t.numpy == full) for short, full in _SHORT.items()},
}
_ITEMSIZE: Final = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2}
_ITEMSIZE.update({"int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8})


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a graph, as graph_info described it."""

    index: int
    name: str
    dtype: DataType | int  # an int: a code this npud does not know
    shape: tuple[int, ...]
    nbytes: int

    def describe(self) -> str:
        kind = self.dtype.numpy if isinstance(self.dtype, DataType) else f"type {self.dtype:#x}"
        return f"{kind} {list(self.shape)}"


def arena_layout(specs: Sequence[TensorSpec]) -> tuple[tuple[int, ...], int]:
    """Each tensor's offset in a run's arena and the arena's size (npud.idl.arena)."""
    return arena.arena_layout(spec.nbytes for spec in specs)


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    index: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    name: str = ""
    """The name the model gives the graph (graph_name); empty when it gives none or the
    skel predates graph_name."""
    rooms: frozenset[str] = frozenset()
    """Outputs whose shape may be a room the data fills in part (their real shape comes
    with each run: run_dims): those given a shape the model leaves free, and those the
    DSP sized (from the inputs' shapes, or from the model's own bound)."""

    @property
    def input_arena(self) -> int:
        """Bytes of the inputs arena :meth:`PortalQnn.run_arena` takes."""
        return arena_layout(self.inputs)[1]

    @property
    def output_arena(self) -> int:
        """Bytes of the outputs arena :meth:`PortalQnn.run_arena` needs at least."""
        return arena_layout(self.outputs)[1]

    def input(self, key: TensorKey) -> TensorSpec:
        return find_tensor(self.inputs, key, f"input of graph {self.index}")

    def output(self, key: TensorKey) -> TensorSpec:
        return find_tensor(self.outputs, key, f"output of graph {self.index}")


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model in a slot: what the file was and every graph's tensors."""

    slot: int
    graphs: tuple[GraphSpec, ...]
    file: Sniffed


def find_tensor(specs: Sequence[TensorSpec], key: TensorKey, what: str) -> TensorSpec:
    if isinstance(key, int) and not isinstance(key, bool):
        if 0 <= key < len(specs):
            return specs[key]
    elif isinstance(key, str):
        for spec in specs:
            if spec.name == key:
                return spec
    names = ", ".join(repr(s.name) for s in specs) or "none"
    raise ModelError(ModelFailure.BAD_TENSOR, f"{key!r} is no {what} (it has {names})")


def spec_from_record(index: int, record: idl.Values) -> TensorSpec:
    code = record.integer("data_type")
    rank = min(record.integer("rank"), MAX_RANK)
    dtype: DataType | int = DataType(code) if code in DataType._value2member_map_ else code
    return TensorSpec(
        index=index,
        name=record.text("name"),
        dtype=dtype,
        shape=tuple(record.integers("dims")[:rank]),
        nbytes=record.integer("bytes"),
    )

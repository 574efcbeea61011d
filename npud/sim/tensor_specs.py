"""A portal_qnn graph's tensors sized at load: each tensor's type and fixed shape
(TensorSpec), from the model's declarations, the shapes the URI gives, onnxruntime's
inference and the model's own bounds (npud.sim.onnx_bounds)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from npu_protocol.aee import AEE
from npud.formats import onnx_proto
from npud.idl import arena
from npud.sim import onnx_bounds
from npud.sim.qnn_errors import RefusedError
from npud.sim.qnn_limits import MAX_NAME_BYTES, MAX_RANK, MAX_TENSOR_BYTES, ONNX_TYPES

log = logging.getLogger("npud.sim.portal_qnn")  # the skel's logger: its parts log as it


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @functools.cached_property
    def nbytes(self) -> int:  # cached: a chain's checks ask for it per step and tensor
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def record(self) -> dict[str, object]:
        return {
            "data_type": self.data_type,
            "rank": len(self.shape),
            "dims": list(self.shape),
            "bytes": self.nbytes,
            "name": self.name,
        }


def arena_offsets(specs: Sequence[TensorSpec]) -> tuple[tuple[int, ...], int]:
    """Each tensor's offset in its arena, and the arena's size (npud.idl.arena)."""
    return arena.arena_layout(spec.nbytes for spec in specs)


def declared_io(node: Any) -> tuple[str, str, list[int | str | None]]:
    """name, element type and declared dims of an onnxruntime NodeArg."""
    return str(node.name), str(node.type), list(node.shape)


_Axes = list[tuple[object, object]]
"""Each axis of a tensor as the session and as the model declare it."""


Bounds = Callable[[Mapping[str, tuple[int, ...]]], Mapping[str, tuple[int | None, ...]]]
"""The model's own bounds of its tensors' dimensions, from the inputs' shapes
(npud.sim.onnx_bounds.output_bounds)."""


def resolve_shapes(
    declared: Sequence[tuple[str, str, list[int | str | None]]],
    given: Mapping[str, tuple[int, ...]],
    outputs: frozenset[str] = frozenset(),
    original: Mapping[str, Sequence[onnx_proto.Dim]] | None = None,
    bounds: Bounds | None = None,
) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape with every dimension fixed; RefusedError otherwise.

    ``declared`` is what the session says (after inference, where it ran on the inputs'
    fixed shapes, which no longer name their dimensions); ``original`` the model's own
    declarations, whose named dimensions a given shape binds wherever they appear. An
    empty or ``?`` dim_param names nothing (onnx_proto.dim_name). An output dimension
    these leave free takes the model's own bound where ``bounds`` finds one (asked once,
    with the inputs' shapes): the output's room."""
    models = original or {}
    names = {name for name, _, _ in declared}
    unknown = sorted(set(given) - names)
    if unknown:
        raise RefusedError(AEE.EBADPARM, f"the model has no tensor {unknown[0]!r}")

    def axes(name: str, dims: Sequence[int | str | None]) -> _Axes:
        model = models.get(name)
        if model is None or len(model) != len(dims):
            return [(dim, None) for dim in dims]
        return list(zip(dims, model, strict=True))

    bound: dict[str, int] = {}  # dim_param -> size, from the given shapes
    for name, _, dims in declared:
        if name in given:
            _bind_given(name, axes(name, dims), given[name], bound)
    shapes: dict[str, tuple[int, ...]] = {}
    found: list[Mapping[str, tuple[int | None, ...]]] = []  # the bounds, once asked
    for name, _, dims in declared:
        if name in given:
            shapes[name] = given[name]
            continue
        sizes: list[int | None] = []
        for dim, model in axes(name, dims):
            size = dim if isinstance(dim, int) and dim > 0 else None
            for label in (_dim_name(dim), _dim_name(model)):
                if size is None and label is not None:
                    size = bound.get(label)
            sizes.append(size)
        if None in sizes and name in outputs and bounds is not None:
            if not found:
                found.append(bounds({n: s for n, s in shapes.items() if n not in outputs}))
            sizes = _bounded(sizes, found[0].get(name))
            if None not in sizes:
                log.info(
                    "portal_qnn: an output sized by the model's own bound",
                    extra={"output": name, "room": sizes},
                )
        if None in sizes:
            raise RefusedError(AEE.EINVALIDFORMAT, _unsized(name, axes(name, dims), sizes, outputs))
        shapes[name] = tuple(size for size in sizes if size is not None)
    return shapes


def _bounded(sizes: list[int | None], limits: tuple[int | None, ...] | None) -> list[int | None]:
    """``sizes`` with each free dimension the model's bound of it (at least 1: a room
    holds something), where the bound is known and of the same rank."""
    if limits is None or len(limits) != len(sizes):
        return sizes
    return [
        size if size is not None else (None if limit is None else max(1, limit))
        for size, limit in zip(sizes, limits, strict=True)
    ]


def _bind_given(name: str, axes: _Axes, shape: tuple[int, ...], bound: dict[str, int]) -> None:
    """Check a given shape against the tensor's axes; bind the names it fixes."""
    if len(shape) != len(axes):
        raise RefusedError(
            AEE.EBADPARM, f"{name} has rank {len(axes)}; the shape given has {len(shape)}"
        )
    for axis, ((want, model), have) in enumerate(zip(axes, shape, strict=True)):
        if isinstance(want, int) and want > 0 and want != have:
            raise RefusedError(
                AEE.EBADPARM, f"{name} dimension {axis} is {want}; the shape given says {have}"
            )
        for label in (_dim_name(want), _dim_name(model)):
            if label is not None and bound.setdefault(label, have) != have:
                raise RefusedError(
                    AEE.EBADPARM, f"dimension {label!r} is given as {bound[label]} and {have}"
                )


def _dim_name(dim: object) -> str | None:
    return onnx_proto.dim_name(dim) if isinstance(dim, str) else None


def _unsized(
    name: str,
    dims: _Axes,
    sizes: Sequence[int | None],
    outputs: frozenset[str],
) -> str:
    """Why ``name`` cannot be sized: every free dimension, by its name where it has one,
    and the shape to give with what is fixed kept."""
    free = []
    for axis, ((dim, model), size) in enumerate(zip(dims, sizes, strict=True)):
        if size is None:
            label = _dim_name(model) or _dim_name(dim)
            free.append(f"{axis} ({label!r})" if label else str(axis))
    what = f"dimension {free[0]} is" if len(free) == 1 else f"dimensions {', '.join(free)} are"
    why = " (not from the inputs' shapes)" if name in outputs else ""
    shape = ",".join("N" if size is None else str(size) for size in sizes)
    return f"{name} {what} free{why}: give its shape, {shape}"


def with_input_shapes(data: bytes, given: Mapping[str, tuple[int, ...]]) -> bytes | None:
    """The model with every input's shape fixed (given, declared, or bound through a named
    dimension), when an output's shape does not follow from the declarations and the
    given shapes alone; None when nothing is left to infer, or an input is itself free
    (refused later, naming it)."""
    try:
        declared = onnx_proto.graph_io(onnx_proto.BytesSource(data))
    except (onnx_proto.DamagedError, onnx_proto.LimitError):
        return None  # onnxruntime says what is wrong with it
    bound: dict[str, int] = {}
    for tensor in declared:
        shape = given.get(tensor.name)
        if shape is not None and tensor.dims is not None and len(shape) == len(tensor.dims):
            for want, have in zip(tensor.dims, shape, strict=True):
                name = onnx_proto.dim_name(want)
                if name is not None:
                    bound.setdefault(name, have)

    def resolved(tensor: onnx_proto.GraphTensor) -> tuple[int, ...] | None:
        if tensor.name in given:
            return given[tensor.name]
        if tensor.dims is None:
            return None
        dims = [
            bound.get(onnx_proto.dim_name(d) or "") if isinstance(d, str) else d
            for d in tensor.dims
        ]
        return None if any(d is None or d <= 0 for d in dims) else tuple(dims)  # type: ignore[arg-type]

    if all(resolved(t) is not None for t in declared if t.kind == "output"):
        return None
    inputs: dict[str, tuple[int, ...]] = {}
    for tensor in declared:
        if tensor.kind == "input":
            shape = resolved(tensor)
            if shape is None:
                return None
            inputs[tensor.name] = shape
    return onnx_proto.with_input_shapes(onnx_proto.BytesSource(data), inputs)


def model_bounds(
    data: bytes, inputs: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int | None, ...]]:
    """The model's own bounds of its tensors' dimensions (npud.sim.onnx_bounds), none
    that would make a tensor larger than a QNN tensor may be (its room must be given)."""
    bounds = onnx_bounds.output_bounds(data, inputs)
    for name, dims in list(bounds.items()):
        if None not in dims and math.prod(d for d in dims if d is not None) > MAX_TENSOR_BYTES:
            del bounds[name]
    return bounds


def declared_dims(data: bytes) -> dict[str, tuple[onnx_proto.Dim, ...]]:
    """The model's own declared dimensions by tensor name ({} when it gives none)."""
    try:
        tensors = onnx_proto.graph_io(onnx_proto.BytesSource(data))
    except onnx_proto.DamagedError:
        return {}  # onnxruntime loaded it: what it says stands
    return {t.name: t.dims for t in tensors if t.dims is not None}


def tensor_spec(name: str, onnx_type: str, shape: tuple[int, ...]) -> TensorSpec:
    if onnx_type not in ONNX_TYPES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} is a {onnx_type}, which QNN cannot hold")
    if len(name.encode("utf-8")) >= MAX_NAME_BYTES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"a tensor name is over {MAX_NAME_BYTES - 1} bytes")
    if len(shape) > MAX_RANK:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} has rank {len(shape)} (at most 8)")
    code, dtype = ONNX_TYPES[onnx_type]
    spec = TensorSpec(name, code, np.dtype(dtype), shape)
    if spec.nbytes > MAX_TENSOR_BYTES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} is {spec.nbytes} bytes (at most 64 MiB)")
    return spec
